//! Build helper for clusterfuse kernel crates. In the kernel crate's `build.rs`:
//!
//! ```no_run
//! fn main() -> Result<(), clusterfuse_build::Error> {
//!     clusterfuse_build::build_kernels()
//! }
//! ```
//!
//! It compiles the crate itself for `nvptx64-nvidia-cuda` ([`ARCH`], PTX ISA 8.1) with the device
//! toolchain that `scripts/setup.sh` installs, inserts each kernel's launch directives
//! (`.maxntid`, `.minnctapersm`, `.reqnctapercluster`) into its PTX entry, assembles the
//! result with `ptxas -arch=sm_90a` when available, and writes `$OUT_DIR/clusterfuse.ptx` and
//! its machine code `$OUT_DIR/clusterfuse.cubin` (empty without ptxas) for
//! `clusterfuse::embed_ptx!()`: a GPU then loads the cubin, with no JIT compilation of the PTX
//! at the first launch. The build re-runs when any file of the device build changes.

mod directives;
mod inspect;
mod report;
mod toolchain;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::{env, fmt, fs};

pub use directives::{entry_names, insert_directives, KernelDirectives};
pub use inspect::{check_programmatic_waits, entry, resources, Sass};
pub use report::{parse_report, KernelResources};
pub use toolchain::{home, Toolchain};

/// The architecture kernels are compiled and assembled for: `sm_90a`, Hopper with its
/// architecture-specific instructions (`wgmma`, `setmaxnreg`), which run on sm_90 devices
/// only (H100, H200), not on later ones.
pub const ARCH: &str = "sm_90a";

/// Why the device build failed.
pub enum Error {
    /// A tool of the device toolchain is missing.
    MissingTool { tool: String, path: PathBuf },
    /// The device build (rustc for nvptx64) failed; its diagnostics were printed above.
    DeviceBuild { status: String },
    /// `ptxas` rejected the PTX.
    Ptxas { report: String },
    /// A kernel's facts do not match the PTX.
    Ptx(String),
    /// An I/O error or a missing build-script variable.
    Io(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::MissingTool { tool, path } => write!(
                f,
                "the device toolchain is incomplete: {tool} not found at {}; run `scripts/setup.sh` from the clusterfuse repository (it installs Debian's rustc-web, llvm-22, llvm-bitcode-linker and ptxas)",
                path.display()
            ),
            Error::DeviceBuild { status } => write!(f, "the device build failed ({status}); its errors are printed above"),
            Error::Ptxas { report } => write!(f, "ptxas -arch={ARCH} rejected the PTX:\n{report}"),
            Error::Ptx(msg) => write!(f, "{msg}"),
            Error::Io(msg) => write!(f, "{msg}"),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

fn env_var(name: &str) -> Result<String, Error> {
    env::var(name).map_err(|_| Error::Io(format!("${name} is not set; call build_kernels() from a build script")))
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.display().to_string();
    move |e| Error::Io(format!("{what} {path}: {e}"))
}

/// Builds the calling crate's kernels to PTX; see the crate docs.
pub fn build_kernels() -> Result<(), Error> {
    // The device build runs this build script again, for the host; it must not recurse.
    if env::var("TARGET").is_ok_and(|t| t.starts_with("nvptx64")) || env::var_os("CLUSTERFUSE_DEVICE_BUILD").is_some() {
        return Ok(());
    }
    let manifest_dir = PathBuf::from(env_var("CARGO_MANIFEST_DIR")?);
    let out_dir = PathBuf::from(env_var("OUT_DIR")?);
    let toolchain = Toolchain::find()?;

    // One device target directory per profile directory, shared by the kernel crates built there.
    let target_dir = out_dir.ancestors().nth(3).unwrap_or(&out_dir).join("clusterfuse-device");
    // Diagnostics go to stderr as text; stdout carries cargo's JSON messages, which name the PTX.
    let output = toolchain
        .device_cargo(&manifest_dir.join("Cargo.toml"), &target_dir)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| Error::Io(format!("cannot run {}: {e}", toolchain.cargo.display())))?;
    if !output.status.success() {
        return Err(Error::DeviceBuild { status: output.status.to_string() });
    }
    let raw_ptx = ptx_artifact(&String::from_utf8_lossy(&output.stdout))
        .ok_or_else(|| Error::Io("the device build reported no .ptx artifact for the kernel crate".into()))?;
    watch_sources(&raw_ptx.with_extension("d"), &manifest_dir)?;

    let ptx = fs::read_to_string(&raw_ptx).map_err(io("cannot read the device build's PTX", &raw_ptx))?;
    let ptx = insert_directives(&ptx).map_err(Error::Ptx)?;
    let out_ptx = out_dir.join("clusterfuse.ptx");
    fs::write(&out_ptx, &ptx).map_err(io("cannot write", &out_ptx))?;

    let cubin = out_dir.join("clusterfuse.cubin");
    match &toolchain.ptxas {
        Some(ptxas) => {
            let report = assemble_into(ptxas, &out_ptx, &cubin)?;
            fs::write(out_dir.join("clusterfuse.ptxas.txt"), &report).map_err(io("cannot write", &out_dir))?;
            for (kernel, resources) in parse_report(&report) {
                if resources.spill_store_bytes + resources.spill_load_bytes > 0 {
                    println!("cargo:warning=kernel `{kernel}` spills registers: {resources:?}");
                }
            }
        }
        None => {
            println!("cargo:warning=ptxas not found: the PTX was not assembled for {ARCH}, and a GPU will JIT-compile it at its first launch (run scripts/setup.sh)");
            fs::write(&cubin, []).map_err(io("cannot write", &cubin))?;
        }
    }
    Ok(())
}

/// The `.ptx` file among the artifacts in cargo's JSON messages (`compiler-artifact`): the
/// kernel crate's, whatever its library is named (its dependencies build to `.rlib`s).
fn ptx_artifact(messages: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .flat_map(|message| message["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|file| file.as_str().map(PathBuf::from))
        .find(|file| file.extension().is_some_and(|e| e == "ptx"))
}

/// Assembles `ptx` for [`ARCH`] and returns ptxas's resource report (`-v`).
pub fn assemble(ptxas: &Path, ptx: &Path) -> Result<String, Error> {
    assemble_into(ptxas, ptx, Path::new("/dev/null"))
}

/// [`assemble`], writing the cubin to `cubin`.
fn assemble_into(ptxas: &Path, ptx: &Path, cubin: &Path) -> Result<String, Error> {
    let output = Command::new(ptxas)
        .arg(format!("-arch={ARCH}"))
        .arg("-v")
        .arg("-o")
        .arg(cubin)
        .arg(ptx)
        .output()
        .map_err(|e| Error::Io(format!("cannot run {}: {e}", ptxas.display())))?;
    let report = String::from_utf8_lossy(&output.stderr).into_owned() + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(Error::Ptxas { report });
    }
    Ok(report)
}

/// Re-run this build script when any source file of the device build changes: the kernel
/// crate's and those of its path dependencies (the device library, the macros), as listed in
/// the device build's dep-info file (files of the standard library and registry are fixed),
/// or the device toolchain does.
fn watch_sources(dep_info: &Path, manifest_dir: &Path) -> Result<(), Error> {
    println!("cargo:rerun-if-changed={}", manifest_dir.join("Cargo.toml").display());
    println!("cargo:rerun-if-env-changed=CLUSTERFUSE_HOME");
    // The toolchain too: a build made before `ptxas` was installed embedded an empty cubin,
    // and is redone once it is (cargo reruns the script while a watched path is missing).
    let tools = home().join("bin");
    for tool in [tools.join("ptxas"), tools.join("llvm-bitcode-linker"), PathBuf::from("/usr/bin/rustc")] {
        println!("cargo:rerun-if-changed={}", tool.display());
    }
    let text = fs::read_to_string(dep_info).map_err(io("cannot read dep-info", dep_info))?;
    let Some((_, deps)) = text.lines().next().and_then(|l| l.split_once(": ")) else {
        return Ok(());
    };
    // Paths are space-separated, with spaces inside a path escaped as `\ `.
    let deps = deps.replace("\\ ", "\u{0}");
    for dep in deps.split_whitespace().map(|d| d.replace('\u{0}', " ")) {
        let fixed = dep.starts_with("/usr/lib/rustlib") || dep.contains("/.cargo/registry/");
        if !fixed {
            println!("cargo:rerun-if-changed={dep}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::ptx_artifact;
    use std::path::PathBuf;

    #[test]
    fn the_ptx_is_found_among_cargos_messages_whatever_the_library_is_called() {
        let messages = r#"{"reason":"compiler-artifact","target":{"name":"core"},"filenames":["/t/deps/libcore-1.rlib"]}
{"reason":"build-script-executed","package_id":"x"}
{"reason":"compiler-artifact","target":{"name":"my_kernels"},"filenames":["/t/nvptx64-nvidia-cuda/release/my_kernels.ptx"]}
{"reason":"build-finished","success":true}"#;
        assert_eq!(ptx_artifact(messages), Some(PathBuf::from("/t/nvptx64-nvidia-cuda/release/my_kernels.ptx")));
        assert_eq!(ptx_artifact(r#"{"reason":"build-finished","success":true}"#), None);
    }
}
