//! What a test asks of a kernel crate's PTX: one entry's text, every kernel's resources
//! (`ptxas -v`), its SASS (`cuobjdump`), and whether loads stay behind programmatic waits.

use crate::toolchain::require;
use crate::{assemble, home, io, parse_report, Error, KernelResources};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::{env, fs};

/// The text of `name`'s `.entry` in `ptx`, from its header to its closing brace, for tests that
/// check what a kernel's PTX does (loads before a wait, no atomics, ..).
pub fn entry<'p>(ptx: &'p str, name: &str) -> Option<&'p str> {
    let body = &ptx[ptx.find(&format!(".entry {name}("))?..];
    Some(&body[..body.find("\n}\n")?])
}

/// Every kernel's resources in `ptx` (registers, spills, shared memory), and ptxas's whole
/// report (its performance warnings included): `ptx` assembled for [`ARCH`](crate::ARCH) by the installed
/// `ptxas`, for tests that bound a kernel's spills and shared memory.
pub fn resources(ptx: &str) -> Result<(BTreeMap<String, KernelResources>, String), Error> {
    let ptxas = require("ptxas", home().join("bin/ptxas"))?;
    let scratch = Scratch::with(ptx)?;
    let report = assemble(&ptxas, &scratch.ptx())?;
    Ok((parse_report(&report), report))
}

/// A temporary directory of its own (tests run in parallel) holding a PTX module, removed on
/// drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Self, Error> {
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let scratch = Self(env::temp_dir().join(format!("clusterfuse-{}-{call}", std::process::id())));
        fs::create_dir_all(&scratch.0).map_err(io("cannot create", &scratch.0))?;
        Ok(scratch)
    }

    fn with(ptx: &str) -> Result<Self, Error> {
        let scratch = Self::new()?;
        fs::write(scratch.ptx(), ptx).map_err(io("cannot write", &scratch.ptx()))?;
        Ok(scratch)
    }

    fn ptx(&self) -> PathBuf {
        self.0.join("module.ptx")
    }

    fn cubin(&self) -> PathBuf {
        self.0.join("module.cubin")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        fs::remove_dir_all(&self.0).ok();
    }
}

/// The SASS of a module's kernels, for tests of what ptxas made of them: the cubin a kernel
/// crate's build embedded beside its PTX (ptxas's output for [`ARCH`](crate::ARCH), what a GPU
/// loads), in a temporary directory (removed on drop), each kernel disassembled on demand by
/// the installed `cuobjdump`.
pub struct Sass {
    scratch: Scratch,
    bin: PathBuf,
}

impl Sass {
    /// Takes `cubin`; [`Error::Ptx`] when it is empty (a build without `ptxas`).
    pub fn new(cubin: &[u8]) -> Result<Self, Error> {
        if cubin.is_empty() {
            return Err(Error::Ptx("the embedded cubin is empty: the kernel crate was built without ptxas; run scripts/setup.sh and rebuild".into()));
        }
        let bin = home().join("bin");
        require("cuobjdump", bin.join("cuobjdump"))?;
        let scratch = Scratch::new()?;
        fs::write(scratch.cubin(), cubin).map_err(io("cannot write", &scratch.cubin()))?;
        Ok(Self { scratch, bin })
    }

    /// `kernel`'s SASS (`cuobjdump --dump-sass -fun kernel`).
    pub fn of(&self, kernel: &str) -> Result<String, Error> {
        let cubin = self.scratch.cubin();
        // cuobjdump runs nvdisasm, which it looks for on the PATH.
        let path = env::join_paths(std::iter::once(self.bin.clone()).chain(env::split_paths(&env::var_os("PATH").unwrap_or_default()))).map_err(|e| Error::Io(e.to_string()))?;
        let output = Command::new(self.bin.join("cuobjdump")).env("PATH", path).args(["--dump-sass", "-fun", kernel]).arg(&cubin).output().map_err(io("cannot run cuobjdump on", &cubin))?;
        if !output.status.success() {
            return Err(Error::Ptx(format!("cuobjdump: {}", String::from_utf8_lossy(&output.stderr))));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// Checks that no kernel of `ptx` (`sass`: its cubin's) reads global memory ahead of its
/// programmatic wait more than its PTX does, and returns how many kernels wait: ptxas may
/// issue a read-only load (`ld.global.nc`, which it takes to be invariant for the whole
/// kernel) before `griddepcontrol.wait` (`ACQBULK`), and under programmatic dependent launch
/// that load reads what the previous kernel may still be writing. Loads a kernel issues before its wait on
/// purpose (weights, a published buffer's epoch) are its PTX's; the PTX count is textual, an
/// upper bound for the loads the wait can precede.
pub fn check_programmatic_waits(ptx: &str, sass: &Sass) -> Result<usize, Error> {
    let waiting: Vec<(&str, &str)> = crate::entry_names(ptx)
        .filter_map(|name| entry(ptx, name).map(|text| (name, text)))
        .filter(|(_, text)| text.contains("griddepcontrol.wait;"))
        .collect();
    for &(name, text) in &waiting {
        // Every `ld` of global memory, predicated or not: `ld.global.*`, and
        // `ld.relaxed.gpu.global.*` and the like (a published buffer's epoch, read as a
        // persistent kernel starts).
        let is_global_load = |l: &&str| l.split_whitespace().any(|t| t.starts_with("ld.") && t.contains(".global"));
        let in_ptx = text[..text.find("griddepcontrol.wait;").unwrap_or(0)].lines().filter(is_global_load).count();
        let code = sass.of(name)?;
        let wait = code.find("ACQBULK").ok_or_else(|| Error::Ptx(format!("`{name}`: no ACQBULK in the SASS")))?;
        let is_load = |l: &&str| l.split_whitespace().any(|t| t == "LDG" || t.starts_with("LDG."));
        let in_sass = code[..wait].lines().filter(is_load).count();
        if in_sass > in_ptx {
            return Err(Error::Ptx(format!("`{name}`: {in_sass} global loads before ACQBULK in the SASS, {in_ptx} before the wait in the PTX")));
        }
    }
    Ok(waiting.len())
}
