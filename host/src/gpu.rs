//! One GPU: its context, default stream, loaded modules and buffers.

use crate::error::{DriverContext, Error, Result};
use crate::kernel::{Kernel, KernelFacts};
use cudarc::driver::sys::CUdevice_attribute as DevAttr;
use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nvrtc::Ptx as CudarcPtx;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A kernel crate's PTX, embedded in the binary at build time (`clusterfuse::embed_ptx!()`).
#[derive(Debug)]
pub struct Ptx {
    /// The kernel crate's name: the module's identity in each GPU's cache.
    pub module: &'static str,
    /// The PTX text.
    pub text: &'static str,
}

impl Ptx {
    /// Names a module's PTX text.
    pub const fn new(module: &'static str, text: &'static str) -> Self {
        Self { module, text }
    }
}

/// One Hopper GPU: a context, its default stream, and each PTX module loaded once.
pub struct Gpu {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    smem_limit: u32,
}

impl Gpu {
    /// Opens GPU `ordinal`. Fails with [`Error::NoGpu`], saying why, where there is no CUDA
    /// driver, no such device, or a device older than Hopper (sm_90).
    pub fn new(ordinal: usize) -> Result<Self> {
        // SAFETY: only probes whether the driver library can be loaded.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoGpu("the CUDA driver library (libcuda.so) is not installed".into()));
        }
        let context = CudaContext::new(ordinal).map_err(|e| Error::NoGpu(format!("cannot open GPU {ordinal}: {e}")))?;
        let (major, minor) = context.compute_capability().driver("cuDeviceGetAttribute", None)?;
        if major < 9 {
            let name = context.name().unwrap_or_default();
            return Err(Error::NoGpu(format!("GPU {ordinal} ({name}) is sm_{major}{minor}; clusterfuse needs Hopper (sm_90)")));
        }
        let smem_limit = context.attribute(DevAttr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN).driver("cuDeviceGetAttribute", None)? as u32;
        let stream = context.default_stream();
        Ok(Self { context, stream, modules: Mutex::new(HashMap::new()), smem_limit })
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> Result<String> {
        self.context.name().driver("cuDeviceGetName", None)
    }

    /// The cudarc context, for anything this crate does not wrap.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// The default stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Shared memory one block may use on this device, static and dynamic together.
    pub fn smem_limit(&self) -> u32 {
        self.smem_limit
    }

    /// Loads `facts.name` from `ptx`, loading the module itself only the first time.
    pub fn load_kernel(&self, ptx: &Ptx, facts: &'static KernelFacts) -> Result<Kernel> {
        let module = self.module(ptx)?;
        let function = module
            .load_function(facts.name)
            .map_err(|_| Error::MissingKernel { kernel: facts.name, module: ptx.module })?;
        Kernel::new(module, function, facts, self.smem_limit)
    }

    fn module(&self, ptx: &Ptx) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(module) = modules.get(ptx.module) {
            return Ok(module.clone());
        }
        let module = self.context.load_module(CudarcPtx::from_src(ptx.text)).driver("cuModuleLoadData", None)?;
        modules.insert(ptx.module, module.clone());
        Ok(module)
    }

    /// Copies `host` to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(host).driver("cuMemcpyHtoD", None)
    }

    /// Copies a device buffer back to the host (waits for the stream).
    pub fn download<T: DeviceRepr>(&self, device: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(device).driver("cuMemcpyDtoH", None)
    }

    /// A new zeroed device buffer of `len` elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(len).driver("cuMemAlloc", None)
    }

    /// Waits for all work on the default stream; surfaces faults of earlier launches.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().driver("cuStreamSynchronize", None)
    }
}
