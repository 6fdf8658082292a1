#!/usr/bin/env bash
# Installs the toolchains clusterfuse needs:
#   - the host toolchain pinned in rust-toolchain.toml (rustup's)
#   - Debian's rustc-web 1.96 (+ std source) and LLVM 22 tools        -> /usr/bin, /usr/lib/llvm-22/bin
#   - llvm-bitcode-linker, built from the rustc-web source package     -> $CLUSTERFUSE_HOME/bin
#   - ptxas / cuobjdump / nvdisasm from PyPI (nvidia-cuda-* 13.x)     -> $CLUSTERFUSE_HOME/venv, linked into bin
# Idempotent: every step checks first and prints "ok: ..." when there is nothing to do.
set -euo pipefail

CLUSTERFUSE_HOME="${CLUSTERFUSE_HOME:-$HOME/.cache/clusterfuse}"
BIN="$CLUSTERFUSE_HOME/bin"
VENV="$CLUSTERFUSE_HOME/venv"
LLVM_BIN=/usr/lib/llvm-22/bin
RUST_SRC=/usr/lib/rustlib/src/rust/library
RUSTC_WANT=1.96
APT_PKGS=(rustc-web cargo-web rust-web-src llvm-22 llvm-22-tools llvm-22-linker-tools)
PIP_PKGS=('nvidia-cuda-nvcc>=13,<14' 'nvidia-cuda-cuobjdump>=13,<14' 'nvidia-cuda-nvdisasm>=13,<14')
PYTHON="${PYTHON:-python3}"

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }

mkdir -p "$BIN"
# One setup at a time per CLUSTERFUSE_HOME (parallel CI jobs, test + run at once).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$CLUSTERFUSE_HOME/.setup.lock"
    flock 9
fi

is_root() { [ "$(id -u)" = 0 ]; }

# Installs Debian packages, or stops saying which command to run.
apt_install() {
    if ! is_root || ! command -v apt-get >/dev/null 2>&1; then
        die "missing Debian packages; run:
    sudo apt-get update && sudo apt-get install -y $*
and then run $0 again."
    fi
    say "installing Debian packages: $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "$@"
}

rustc_ok() { [ -x /usr/bin/rustc ] && /usr/bin/rustc --version 2>/dev/null | grep -q "^rustc $RUSTC_WANT\."; }
llvm_ok() { [ -x "$LLVM_BIN/llc" ] && [ -x "$LLVM_BIN/llvm-link" ] && [ -x "$LLVM_BIN/opt" ]; }
apt_ok() { rustc_ok && [ -x /usr/bin/cargo ] && llvm_ok && [ -d "$RUST_SRC/core" ]; }

# --- 0. The host toolchain pinned in rust-toolchain.toml (rustup's) ---------------------------
# rustup cannot download it here (no access to its server); where its stable toolchain is
# that very version, the pin is made a link to it.
PIN=$(sed -n 's/^channel = "\(.*\)"$/\1/p' "$(dirname "$0")/../rust-toolchain.toml")
if command -v rustup >/dev/null 2>&1; then
    TOOLCHAINS="${RUSTUP_HOME:-$HOME/.rustup}/toolchains"
    HOST=$(RUSTUP_TOOLCHAIN=stable rustc -vV 2>/dev/null | sed -n 's/^host: //p')
    if [ -n "$HOST" ] && [ -e "$TOOLCHAINS/$PIN-$HOST" ]; then
        say "ok: rust $PIN ($HOST)"
    elif [ -n "$HOST" ] && RUSTUP_TOOLCHAIN=stable rustc --version | grep -q "^rustc $PIN "; then
        ln -sfn "stable-$HOST" "$TOOLCHAINS/$PIN-$HOST"
        say "rust $PIN: rustup's stable toolchain is that version; linked it as $PIN"
    else
        rustup toolchain install "$PIN" --profile minimal \
            || die "rust $PIN (rust-toolchain.toml) is not installed and rustup could not install it; install it with: rustup toolchain install $PIN"
    fi
else
    die "rustup not found: the host crates build with rust $PIN (rust-toolchain.toml); install rustup (https://rustup.rs) and run $0 again"
fi

# --- 1. Debian packages: rustc-web 1.96, its std source, LLVM 22 -------------------------------
if apt_ok; then
    say "ok: rustc $(/usr/bin/rustc --version | awk '{print $2}'), llvm-22, rust std source"
else
    apt_install "${APT_PKGS[@]}"
    apt_ok || die "after installing ${APT_PKGS[*]}: expected /usr/bin/rustc $RUSTC_WANT.x (got: $(/usr/bin/rustc --version 2>&1 || true)), $LLVM_BIN/llc and $RUST_SRC"
fi

# --- 2. llvm-bitcode-linker (rustc's linker for nvptx64), built from the installed source ------
linker_ok() { [ -x "$BIN/llvm-bitcode-linker" ] && "$BIN/llvm-bitcode-linker" --help >/dev/null 2>&1; }
if linker_ok; then
    say "ok: $BIN/llvm-bitcode-linker"
else
    src="/usr/src/rustc-$(/usr/bin/rustc --version | awk '{print $2}')/src/tools/llvm-bitcode-linker"
    [ -f "$src/Cargo.toml" ] || die "no llvm-bitcode-linker source at $src (it ships in Debian's rust-web-src)"
    scratch="$CLUSTERFUSE_HOME/src/llvm-bitcode-linker"
    say "building llvm-bitcode-linker from $src"
    rm -rf "$scratch"
    mkdir -p "$(dirname "$scratch")"
    cp -r "$src" "$scratch"
    printf '\n[workspace]\n' >>"$scratch/Cargo.toml"
    built=
    # Debian's cargo first (pin its rustc: a bare `rustc` on PATH may be rustup's), then rustup's.
    for c in "/usr/bin/cargo:/usr/bin/rustc" "cargo:"; do
        cargo_bin=${c%%:*} rustc_bin=${c#*:}
        command -v "$cargo_bin" >/dev/null 2>&1 || continue
        if (cd "$scratch" && env -u RUSTC -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_TARGET -u RUSTC_WRAPPER \
                ${rustc_bin:+RUSTC=$rustc_bin} CARGO_TARGET_DIR="$scratch/target" \
                "$cargo_bin" build --release --quiet); then
            built=$cargo_bin
            break
        fi
        say "build with $cargo_bin failed; trying the next cargo"
    done
    [ -n "$built" ] || die "could not build llvm-bitcode-linker (see the cargo output above)"
    install -m 755 "$scratch/target/release/llvm-bitcode-linker" "$BIN/llvm-bitcode-linker.tmp"
    mv -f "$BIN/llvm-bitcode-linker.tmp" "$BIN/llvm-bitcode-linker"
    rm -rf "$scratch/target"
    linker_ok || die "$BIN/llvm-bitcode-linker was built (with $built) but does not run"
    say "built $BIN/llvm-bitcode-linker (with $built)"
fi

# --- 3. ptxas, cuobjdump, nvdisasm from PyPI, in a venv the project owns -----------------------
cuda_tools_ok() {
    local t
    for t in ptxas cuobjdump nvdisasm; do
        "$BIN/$t" --version >/dev/null 2>&1 || return 1
    done
}
if cuda_tools_ok; then
    say "ok: $BIN/{ptxas,cuobjdump,nvdisasm}"
else
    if ! [ -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
        command -v "$PYTHON" >/dev/null 2>&1 || die "no $PYTHON on PATH (Python 3 is needed for the ptxas venv)"
        rm -rf "$VENV"
        if ! "$PYTHON" -m venv "$VENV" >/dev/null 2>&1; then
            # Debian's own python3 needs python3-venv (ensurepip) for this.
            rm -rf "$VENV"
            apt_install python3-venv
            "$PYTHON" -m venv "$VENV" || die "could not create a venv at $VENV with $PYTHON"
        fi
        say "created venv $VENV"
    fi
    say "installing ${PIP_PKGS[*]} into $VENV (about 350 MB)"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PIP_PKGS[@]}"
    cudabin=
    for d in $("$VENV/bin/python" -c 'import sysconfig as s; p=s.get_paths(); print(p["purelib"], p["platlib"])'); do
        if [ -x "$d/nvidia/cu13/bin/ptxas" ]; then cudabin="$d/nvidia/cu13/bin"; break; fi
    done
    [ -n "$cudabin" ] || die "ptxas not found under nvidia/cu13/bin in $VENV's site-packages"
    for t in ptxas cuobjdump nvdisasm; do
        [ -x "$cudabin/$t" ] || die "$cudabin/$t missing after pip install"
        ln -sfn "$cudabin/$t" "$BIN/$t"
    done
    cuda_tools_ok || die "$BIN/{ptxas,cuobjdump,nvdisasm} installed but do not run"
    say "linked ptxas, cuobjdump, nvdisasm from $cudabin into $BIN"
fi

# --- summary -------------------------------------------------------------------------------
rustc_v=$(/usr/bin/rustc --version | awk '{print $2}')
llc_v=$("$LLVM_BIN/llc" --version | sed -n 's/.*LLVM version \([0-9.]*\).*/\1/p' | head -n1)
ptxas_v=$("$BIN/ptxas" --version | sed -n 's/.*release [0-9.]*, V\([0-9.]*\).*/\1/p' | head -n1)
say "ready: rustc $rustc_v, llc $llc_v, ptxas $ptxas_v (tools in $BIN, llvm in $LLVM_BIN)"
