#!/usr/bin/env bash
# Installs what the GPU build of clusterfuse-candle (`--features cuda`: candle's CUDA backend)
# needs on a machine without CUDA, into $CLUSTERFUSE_HOME/candle-cuda, and prints the
# environment to build with (eval "$(scripts/setup-candle.sh)"). Only for that build: CI and
# `cargo test --workspace` do not need it.
#   - nvcc 13.0 (PyPI): candle-kernels compiles its .cu files to PTX at build time; PTX from a
#     newer nvcc (13.5: PTX ISA 9.5) is refused by the H200 machine's driver (580, CUDA 13.0).
#   - cuBLAS, cuBLASLt, cuRAND, NVRTC and the runtime 13 (PyPI), which cudarc and candle-kernels link
#     under candle (`dynamic-linking`); at run time the GPU machine's copies (PyTorch's) are used.
#   - libcuda.so: a stub exporting the driver API's names, to link against (the driver's own
#     libcuda.so.1 is loaded at run time).
# Idempotent.
set -euo pipefail

CLUSTERFUSE_HOME="${CLUSTERFUSE_HOME:-$HOME/.cache/clusterfuse}"
ROOT="$CLUSTERFUSE_HOME/candle-cuda"
VENV="$ROOT/venv"
PYTHON="${PYTHON:-python3}"
PIP_PKGS=('nvidia-cuda-nvcc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cccl==13.0.*' 'nvidia-cuda-crt==13.0.*' 'nvidia-nvvm==13.0.*' 'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cublas==13.0.*' 'nvidia-curand>=10.4,<10.5')

say() { echo "setup-candle: $*" >&2; }

mkdir -p "$ROOT"
if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
fi
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
CUDA="$site/nvidia/cu13"
# nvcc 13.0 with its own compiler front end (nvvm) and headers (crt), and the libraries.
installed() {
    [ -x "$CUDA/bin/nvcc" ] && "$CUDA/bin/nvcc" --version | grep -q "release 13\.0" \
        && [ "$("$VENV/bin/python" -m pip list 2>/dev/null | grep -E '^nvidia-(nvvm|cuda-crt) ' | grep -c ' 13\.0\.')" = 2 ] \
        && [ -d "$CUDA/include/cccl/nv" ] && [ -e "$CUDA/lib/libcublas.so.13" ] && [ -e "$CUDA/lib/libcurand.so.10" ] && [ -e "$CUDA/lib/libnvrtc.so.13" ]
}
if installed; then
    say "ok: nvcc 13.0 and the CUDA 13 libraries in $CUDA"
else
    say "installing ${PIP_PKGS[*]}"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${PIP_PKGS[@]}" >&2
    installed || { echo "setup-candle: error: after installing, nvcc 13.0 (nvvm, crt 13.0) or a library is missing in $CUDA" >&2; exit 1; }
fi

# Unversioned names for the linker (-lcublas ...), beside the libraries.
for lib in cudart cublas cublasLt curand nvrtc; do
    real=$(ls "$CUDA/lib/lib$lib.so."* | grep -E "lib$lib\.so\.[0-9]+$" | head -1)
    ln -sf "$real" "$CUDA/lib/lib$lib.so"
done

# libcuda.so: a stub with every driver function cudarc binds.
stub="$CUDA/lib/libcuda.so"
if [ ! -e "$stub" ]; then
    cudarc=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.19.* | sort -V | tail -1)
    say "building the libcuda stub from $cudarc"
    grep -oE 'pub (unsafe )?fn cu[A-Za-z0-9_]+' "$cudarc/src/driver/sys/mod.rs" | awk '{print $NF}' | sort -u \
        | sed 's/.*/void &(void) {}/' >"$ROOT/libcuda-stub.c"
    cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub" "$ROOT/libcuda-stub.c"
fi

# The environment for `cargo build -p clusterfuse-candle --features cuda`.
echo "export PATH=\"$CUDA/bin:\$PATH\" CUDA_PATH=\"$CUDA\" CUDA_ROOT=\"$CUDA\" CUDA_COMPUTE_CAP=90 LIBRARY_PATH=\"$CUDA/lib\${LIBRARY_PATH:+:\$LIBRARY_PATH}\""
