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
    /// A buffer, stream or kernel of one device was used with another's: two GPUs, or a GPU
    /// and the CPU emulator.
    #[error("mixed devices: a buffer, stream or kernel of one device (a GPU or the CPU emulator) was used with another's")]
    WrongBackend,
    /// A launch on a stream other than the one a buffer was made on, in a context whose
    /// cudarc event tracking is off ([`Gpu::new`](crate::Gpu::new) turns it off): nothing would
    /// order the launch after the buffer's upload, nor the buffer's free after the launch.
    #[error("a buffer made on one stream was passed to a launch on another, in a context with cudarc's event tracking off (as `Gpu::new` leaves it), where nothing orders them; launch on the buffer's own stream (its `Gpu`'s), or use a context with event tracking on")]
    UnorderedStream,
    /// A graph capture or update failed; nothing was replaced.
    #[error(transparent)]
    Capture(#[from] CaptureError),
    /// A TMA tensor map cannot describe the tensor: what and why.
    #[error("invalid tensor map: {0}")]
    InvalidTensorMap(String),
    /// A persistent kernel's grid does not fit on the GPU at once, so blocks waiting for
    /// others' published tiles could wait for blocks that never start.
    #[error("persistent kernel `{kernel}` needs its {blocks} blocks resident at once, but the GPU holds at most {resident} of this configuration (block, shared memory, cluster); launch at most {resident} blocks (`Kernel::max_resident_blocks`)")]
    NotCoResident { kernel: &'static str, blocks: u64, resident: u64 },
    /// A published buffer's tiling is impossible.
    #[error("invalid published buffer: {0}")]
    InvalidPublished(String),
    /// A library kernel does not support the shape it was given: which and why.
    #[error("{kernel} does not support this shape: {reason}")]
    UnsupportedShape { kernel: &'static str, reason: String },
    /// A launch recording was started while one was already running on this device.
    #[error("a launch recording is already running on this device; finish it before starting another")]
    AlreadyRecording,
}

/// Why a graph could not be captured or updated.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// Graphs need a GPU: the emulator runs each launch when it is made, leaving nothing to replay.
    #[error("CUDA graphs need a GPU; the CPU emulator runs each launch as it is made, so there is nothing to capture")]
    Emulator,
    /// The capturing thread waited for the GPU, which a capture cannot contain.
    #[error("`{call}` inside a graph capture: a capture records launches without running them, so there is nothing to wait for; synchronise after replaying")]
    Synchronize { call: &'static str },
    /// The driver invalidated the capture (an unsupported call was made while capturing).
    #[error("the driver ended the capture: {0}")]
    Invalidated(DriverError),
    /// `cuGraphExecUpdate` refused the new launches: they differ from the graph's in more
    /// than their parameters.
    #[error("cannot update the graph in place: {0}; capture a new graph instead")]
    UpdateRefused(GraphChange),
}

/// What differed between a graph and the launches meant to update it
/// (`CUgraphExecUpdateResult`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GraphChange {
    #[error("the number of launches or their dependencies changed")]
    Topology,
    #[error("a node's type changed")]
    NodeType,
    #[error("a launch's kernel changed")]
    Function,
    #[error("a launch's parameters changed in a way the driver cannot update (e.g. its grid or cluster)")]
    Parameters,
    #[error("a launch's attributes changed")]
    Attributes,
    #[error("the driver does not support updating this graph")]
    Unsupported,
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
