//! Where the device toolchain lives, and the command that runs the device build.

use crate::Error;
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The device toolchain: Debian's rustc-web and llvm-22, the llvm-bitcode-linker built from
/// its source, and ptxas from PyPI, as `scripts/setup.sh` installs them.
pub struct Toolchain {
    pub cargo: PathBuf,
    pub rustc: PathBuf,
    pub llvm_bin: PathBuf,
    /// Folder holding `llvm-bitcode-linker` (and `ptxas`).
    pub tools_bin: PathBuf,
    pub ptxas: Option<PathBuf>,
}

/// `$CLUSTERFUSE_HOME`, by default `~/.cache/clusterfuse`.
pub fn home() -> PathBuf {
    env::var_os("CLUSTERFUSE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/clusterfuse")
    })
}

/// `path`, or [`Error::MissingTool`] naming `tool` when nothing is there.
pub(crate) fn require(tool: &str, path: PathBuf) -> Result<PathBuf, Error> {
    if path.exists() {
        Ok(path)
    } else {
        Err(Error::MissingTool { tool: tool.to_string(), path })
    }
}

impl Toolchain {
    /// Finds every tool, or says which is missing and how to install it.
    pub fn find() -> Result<Self, Error> {
        let tools_bin = home().join("bin");
        let llvm_bin = PathBuf::from("/usr/lib/llvm-22/bin");
        require("llvm-link (llvm-22)", llvm_bin.join("llvm-link"))?;
        require("llvm-bitcode-linker", tools_bin.join("llvm-bitcode-linker"))?;
        require("the library source (rust-web-src)", PathBuf::from("/usr/lib/rustlib/src/rust/library/core"))?;
        let ptxas = Some(tools_bin.join("ptxas")).filter(|p| p.exists());
        Ok(Self {
            cargo: require("cargo (rustc-web)", PathBuf::from("/usr/bin/cargo"))?,
            rustc: require("rustc (rustc-web)", PathBuf::from("/usr/bin/rustc"))?,
            llvm_bin,
            tools_bin,
            ptxas,
        })
    }

    /// `cargo rustc` building a kernel crate as a PTX `cdylib` into `target_dir`, with an
    /// environment cleared of the outer (host) build's variables.
    pub fn device_cargo(&self, manifest: &Path, target_dir: &Path) -> Command {
        let mut cmd = Command::new(&self.cargo);
        for (key, _) in env::vars_os() {
            let key = key.to_string_lossy();
            let outer = key.starts_with("CARGO") && key != "CARGO_HOME" || key.starts_with("RUSTC") || key.starts_with("RUSTFLAGS")
                || key.starts_with("RUSTUP") || key == "RUSTDOCFLAGS" || key == "TARGET" || key == "HOST" || key == "OUT_DIR"
                || key == "PROFILE" || key == "OPT_LEVEL" || key == "DEBUG" || key == "NUM_JOBS";
            if outer {
                cmd.env_remove(&*key);
            }
        }
        let path = env::var_os("PATH").unwrap_or_default();
        let mut paths = vec![self.tools_bin.clone(), self.llvm_bin.clone()];
        paths.extend(env::split_paths(&path));
        cmd.env("PATH", env::join_paths(paths).expect("PATH entries contain no separator"))
            .env("RUSTC", &self.rustc)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CLUSTERFUSE_DEVICE_BUILD", "1")
            .env("CARGO_ENCODED_RUSTFLAGS", format!("-Ctarget-cpu={}\u{1f}-Ctarget-feature=+ptx81", crate::ARCH))
            .args(["rustc", "--lib", "--release", "--crate-type", "cdylib", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .args(["--config", "profile.release.panic=\"abort\"", "--message-format=json-render-diagnostics", "--target-dir"])
            .arg(target_dir)
            .arg("--manifest-path")
            .arg(manifest)
            .args(["--", "-Zcrate-attr=no_std", "-Zcrate-attr=feature(abi_ptx,asm_experimental_arch,f16)"]);
        cmd
    }
}
