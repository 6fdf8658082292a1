use crate::config::LaunchError;
use cudarc::driver::DriverError;

/// Everything that can go wrong on the host side, each naming the kernel where there is one.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable GPU: no driver library, no device, or a device that is not Hopper.
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    /// A driver call failed.
    #[error("{call} failed{}: {source}", kernel.map(|k| format!(" for kernel `{k}`")).unwrap_or_default())]
    Driver { call: &'static str, kernel: Option<&'static str>, source: DriverError },
    /// The launch configuration breaks a rule; nothing was launched.
    #[error("invalid launch of kernel `{kernel}`: {reason}")]
    InvalidLaunch { kernel: &'static str, reason: LaunchError },
    /// The PTX module has no entry of this name (the kernel crate and the PTX disagree).
    #[error("kernel `{kernel}` is not in PTX module `{module}`; rebuild the kernel crate")]
    MissingKernel { kernel: &'static str, module: &'static str },
    /// A kernel run on the CPU emulator failed: a race, a deadlock, a bad access or a panic.
    #[error("emulated {0}")]
    Emulator(#[from] clusterfuse_device::emu::Fault),
    /// A GPU buffer, stream or kernel was used with the emulator's, or the other way round.
    #[error("mixed backends: a GPU buffer, stream or kernel was used with the CPU emulator's (or the other way round)")]
    WrongBackend,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) trait DriverContext<T> {
    fn driver(self, call: &'static str, kernel: Option<&'static str>) -> Result<T>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn driver(self, call: &'static str, kernel: Option<&'static str>) -> Result<T> {
        self.map_err(|source| Error::Driver { call, kernel, source })
    }
}
