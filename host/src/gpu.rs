//! A device to run kernels on: one Hopper GPU, or the CPU emulator.

use crate::buffer::Buffer;
use crate::error::{DriverContext, Error, Result};
use crate::graph;
use crate::kernel::{Kernel, KernelFacts};
use crate::record::Recorder;
use clusterfuse_device::limits::MAX_SHARED_MEMORY_PER_BLOCK;
use cudarc::driver::sys::{CUdevice_attribute as DevAttr, CUevent_flags};
use cudarc::driver::{CudaContext, CudaModule, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nvrtc::Ptx as CudarcPtx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A kernel crate's PTX and the cubin `ptxas` made of it, embedded in the binary at build
/// time (`clusterfuse::embed_ptx!()`).
#[derive(Debug)]
pub struct Ptx {
    /// The kernel crate's name: the module's identity in each GPU's cache.
    pub module: &'static str,
    /// The PTX text.
    pub text: &'static str,
    /// Its machine code for sm_90a (empty where the build had no `ptxas`): what a GPU loads,
    /// so that no launch waits for the driver to JIT-compile the PTX (tens of seconds for a
    /// crate of large kernels), with the PTX as the fallback where the driver rejects it.
    pub cubin: &'static [u8],
}

impl Ptx {
    /// Names a module's PTX text (no cubin).
    pub const fn new(module: &'static str, text: &'static str) -> Self {
        Self { module, text, cubin: &[] }
    }

    /// The same module with its cubin.
    pub const fn with_cubin(self, cubin: &'static [u8]) -> Self {
        Self { cubin, ..self }
    }
}

/// Where launches go: a CUDA stream, or (on the emulator) the calling thread, which runs
/// each launch to completion before it returns.
pub struct Stream {
    pub(crate) cuda: Option<Arc<CudaStream>>,
    /// The device's launch recorder; None for a graph's capture stream, whose launches
    /// are not run and so not recorded.
    pub(crate) recorder: Option<Arc<Recorder>>,
}

impl Stream {
    /// The cudarc stream (None on the emulator).
    pub fn cuda(&self) -> Option<&Arc<CudaStream>> {
        self.cuda.as_ref()
    }

    /// Whether this is a graph's capture stream (the one stream without a recorder): its
    /// launches are recorded into the graph, to be replayed on another stream.
    pub(crate) fn is_capture(&self) -> bool {
        self.recorder.is_none()
    }
}

/// A device: one Hopper GPU (context, a stream, each PTX module loaded once), or the
/// CPU emulator, which runs the same kernels and launchers on the host.
pub struct Gpu {
    stream: Stream,
    cuda: Option<Cuda>,
    smem_limit: u32,
    recorder: Arc<Recorder>,
}

struct Cuda {
    context: Arc<CudaContext>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
}

impl Gpu {
    /// Opens GPU `ordinal`. Fails with [`Error::NoGpu`], saying why, where there is no CUDA
    /// driver, no such device, or a device that is not Hopper (sm_90).
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only probes whether the driver library can be loaded (linked, it is there).
        #[cfg(not(feature = "dynamic-linking"))]
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoGpu("the CUDA driver library (libcuda.so) is not installed".into()));
        }
        let context = CudaContext::new(ordinal).map_err(|e| Error::NoGpu(format!("cannot open GPU {ordinal}: {e}")))?;
        // SAFETY: no buffer exists yet. Work is ordered by clusterfuse itself: everything runs
        // on the default stream, and a graph's capture stream only records. Without this,
        // once a capture stream exists cudarc would add an event wait and record per buffer
        // to every launch, and put waits on events recorded outside a capture into it
        // (cudarc's own graph test turns tracking off for this reason).
        unsafe { context.disable_event_tracking() };
        Self::on_stream(context.default_stream())
    }

    /// The GPU of `stream`, launching on `stream`: a device whose context and stream another
    /// cudarc user owns (candle's CUDA backend, say), so that kernels launch on that user's
    /// memory in its stream order ([`Buffer::from_raw`]). The context's settings, event
    /// tracking included, are left as they are. Fails with [`Error::NoGpu`] on a device that
    /// is not Hopper (sm_90: the kernels are built for `sm_90a`, which no other architecture
    /// runs).
    pub fn on_stream(stream: Arc<CudaStream>) -> Result<Self> {
        let context = stream.context().clone();
        let (major, minor) = context.compute_capability().driver("cuDeviceGetAttribute", None)?;
        if (major, minor) != (9, 0) {
            let name = context.name().unwrap_or_default();
            return Err(Error::NoGpu(format!("GPU {} ({name}) is sm_{major}{minor}; clusterfuse's kernels are built for Hopper (sm_90a) and run on no other architecture", context.ordinal())));
        }
        let smem_limit = context.attribute(DevAttr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).driver("cuDeviceGetAttribute", None)? as u32;
        let recorder = Arc::new(Recorder::default());
        let stream = Stream { cuda: Some(stream), recorder: Some(recorder.clone()) };
        let cuda = Cuda { context, modules: Mutex::new(HashMap::new()) };
        Ok(Self { stream, cuda: Some(cuda), smem_limit, recorder })
    }

    /// The CPU emulator (see `clusterfuse::emu`): kernels run on the host with GPU semantics,
    /// races and deadlocks reported as [`Error::Emulator`]. Needs no GPU.
    pub fn emulator() -> Self {
        let recorder = Arc::new(Recorder::default());
        let stream = Stream { cuda: None, recorder: Some(recorder.clone()) };
        Self { stream, cuda: None, smem_limit: MAX_SHARED_MEMORY_PER_BLOCK, recorder }
    }

    /// True for the CPU emulator.
    pub fn is_emulator(&self) -> bool {
        self.cuda.is_none()
    }

    /// The device's name, e.g. "NVIDIA H200", or "CPU emulator".
    pub fn name(&self) -> Result<String> {
        match &self.cuda {
            Some(cuda) => cuda.context.name().driver("cuDeviceGetName", None),
            None => Ok("CPU emulator".into()),
        }
    }

    /// The device's multiprocessor count (132 on an H200), or None on the emulator.
    pub fn multiprocessors(&self) -> Result<Option<usize>> {
        self.cuda
            .as_ref()
            .map(|cuda| multiprocessors(&cuda.context))
            .transpose()
    }

    /// The cudarc context, for anything this crate does not wrap (None on the emulator).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        self.cuda.as_ref().map(|cuda| &cuda.context)
    }

    /// The stream launches go to: the context's default stream ([`Gpu::new`]) or the one
    /// the device was made on ([`Gpu::on_stream`]).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The launch recorder behind [`Recording`](crate::Recording).
    pub(crate) fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// Shared memory one block may use on this device, static and dynamic together.
    pub fn smem_limit(&self) -> u32 {
        self.smem_limit
    }

    /// Loads `facts.name` from `ptx`, loading the module itself only the first time (on the
    /// emulator, the kernel's host build runs instead of the PTX).
    pub fn load_kernel(&self, ptx: &Ptx, facts: &'static KernelFacts) -> Result<Kernel> {
        let Some(cuda) = &self.cuda else {
            return Ok(Kernel::emulated(facts, self.smem_limit));
        };
        let module = cuda.module(ptx)?;
        let function = module
            .load_function(facts.name)
            .map_err(|_| Error::MissingKernel { kernel: facts.name, module: ptx.module })?;
        Kernel::cuda(cuda.context.clone(), module, function, facts, self.smem_limit)
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: DeviceRepr + Copy>(&self, host: &[T]) -> Result<Buffer<T>> {
        match self.stream.cuda() {
            Some(stream) => Ok(stream.clone_htod(host).driver("cuMemcpyHtoD", None)?.into()),
            None => Ok(Buffer::emulated(host.to_vec())),
        }
    }

    /// Copies a device buffer back to the host (waits for the stream; a recording logs it as
    /// a synchronisation).
    pub fn download<T: DeviceRepr + Copy>(&self, buffer: &Buffer<T>) -> Result<Vec<T>> {
        graph::forbid_in_capture("Gpu::download")?;
        let values = match (self.stream.cuda(), buffer.as_cuda(), buffer.as_emulated()) {
            (Some(stream), Some(slice), _) if Arc::ptr_eq(stream.context(), slice.context()) => {
                stream.clone_dtoh(slice).driver("cuMemcpyDtoH", None)?
            }
            (None, _, Some(values)) => values.to_vec(),
            _ => return Err(Error::WrongBackend),
        };
        self.recorder.synchronized();
        Ok(values)
    }

    /// A new zeroed device buffer of `len` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<Buffer<T>> {
        match self.stream.cuda() {
            Some(stream) => Ok(stream.alloc_zeros(len).driver("cuMemAlloc", None)?.into()),
            // SAFETY: `ValidAsZeroBits` says all-zero bytes are a valid `T`.
            None => Ok(Buffer::emulated((0..len).map(|_| unsafe { std::mem::zeroed() }).collect())),
        }
    }

    /// How long the work `enqueue` puts on the device's stream takes, in milliseconds: between
    /// two CUDA events recorded around it (on the emulator, which runs launches as they are
    /// made, the wall time of `enqueue`).
    pub fn time_ms<E: From<Error>>(&self, enqueue: impl FnOnce() -> Result<(), E>) -> Result<f64, E> {
        let Some(stream) = self.stream.cuda() else {
            let start = std::time::Instant::now();
            enqueue()?;
            return Ok(start.elapsed().as_secs_f64() * 1e3);
        };
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).driver("cuEventRecord", None)?;
        enqueue()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).driver("cuEventRecord", None)?;
        Ok(start.elapsed_ms(&end).driver("cuEventElapsedTime", None)? as f64)
    }

    /// Waits for all work on the device's stream; surfaces faults of earlier launches. A
    /// recording logs it; inside a graph capture it is [`CaptureError::Synchronize`](crate::CaptureError).
    pub fn synchronize(&self) -> Result<()> {
        graph::forbid_in_capture("Gpu::synchronize")?;
        if let Some(stream) = self.stream.cuda() {
            stream.synchronize().driver("cuStreamSynchronize", None)?;
        }
        self.recorder.synchronized();
        Ok(())
    }
}

/// The multiprocessor count of `context`'s device.
pub(crate) fn multiprocessors(context: &CudaContext) -> Result<usize> {
    context.attribute(DevAttr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).map(|sms| sms as usize).driver("cuDeviceGetAttribute", None)
}

impl Cuda {
    fn module(&self, ptx: &Ptx) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(module) = modules.get(ptx.module) {
            return Ok(module.clone());
        }
        // A driver older than the ptxas that made the cubin refuses it: then the PTX, JIT-compiled.
        let cubin = if ptx.cubin.is_empty() { None } else { self.context.load_module(CudarcPtx::from_binary(ptx.cubin.to_vec())).ok() };
        let module = match cubin {
            Some(module) => module,
            None => self.context.load_module(CudarcPtx::from_src(ptx.text)).driver("cuModuleLoadData", None)?,
        };
        modules.insert(ptx.module, module.clone());
        Ok(module)
    }
}
