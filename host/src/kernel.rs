//! A kernel loaded on one device: its facts, planning, and the launch (GPU or emulator).

use crate::config::{self, LaunchConfig, LaunchPlan};
use crate::error::{DriverContext, Error, Result};
use crate::gpu::Stream;
use clusterfuse_device::{emu, DeviceCopy, Dim3};
use cudarc::driver::sys::{self, CUfunction_attribute as Attr};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

/// What a `#[kernel]` attribute declared. The generated launcher and the PTX directives
/// are both derived from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFacts {
    /// The PTX entry's name.
    pub name: &'static str,
    /// `launch_bounds(max_threads)`: `.maxntid` in the PTX.
    pub max_threads: Option<u32>,
    /// `launch_bounds(min_blocks)`: `.minnctapersm` in the PTX.
    pub min_blocks: Option<u32>,
    /// `cluster(..)`: `.reqnctapercluster` in the PTX.
    pub cluster: Option<Dim3>,
    /// `persistent`: blocks wait on each other (`grid::Published`), so every launch checks
    /// that the whole grid is resident at once.
    pub persistent: bool,
}

/// A kernel loaded on one device. Typed launchers wrap it; [`Kernel::launch_lowered`] is the
/// one place a launch reaches the driver or the emulator.
pub struct Kernel {
    facts: &'static KernelFacts,
    smem_limit: u32,
    cuda: Option<CudaKernel>,
}

/// The GPU side of a kernel: its function and the limits raised on it so far.
struct CudaKernel {
    function: CudaFunction,
    static_smem: u32,
    /// The function's attributes as last set: read, compared and set under one lock, so
    /// that launches from several threads leave the driver's values and these alike.
    attributes: Mutex<FunctionAttributes>,
    /// The plans whose grids were checked to be resident at once (persistent kernels).
    co_resident: Mutex<Vec<LaunchPlan>>,
    /// The GPU the function was loaded on: launches must use its streams.
    context: Arc<CudaContext>,
    _module: Arc<CudaModule>,
}

/// The function attributes a launch plan may need changed ([`CudaKernel::prepare`]).
struct FunctionAttributes {
    /// The dynamic shared memory the function is allowed (48 KB less its static memory until
    /// raised; never lowered).
    dynamic_smem: u32,
    non_portable_cluster: bool,
    /// Whether the shared memory carveout is at its maximum (else the driver's default).
    max_shared_carveout: bool,
}

/// A kernel parameter slot: a pointer to the value, as `cuLaunchKernel` takes it.
#[inline(always)]
pub fn param<T: DeviceCopy>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

impl Kernel {
    pub(crate) fn cuda(context: Arc<CudaContext>, module: Arc<CudaModule>, function: CudaFunction, facts: &'static KernelFacts, smem_limit: u32) -> Result<Self> {
        let attr = |a| function.get_attribute(a).driver("cuFuncGetAttribute", Some(facts.name));
        let static_smem = attr(Attr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as u32;
        let dynamic_allowed = attr(Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)? as u32;
        let cuda = CudaKernel {
            function,
            static_smem,
            attributes: Mutex::new(FunctionAttributes { dynamic_smem: dynamic_allowed, non_portable_cluster: false, max_shared_carveout: false }),
            co_resident: Mutex::new(Vec::new()),
            context,
            _module: module,
        };
        Ok(Self { facts, smem_limit, cuda: Some(cuda) })
    }

    pub(crate) fn emulated(facts: &'static KernelFacts, smem_limit: u32) -> Self {
        Self { facts, smem_limit, cuda: None }
    }

    /// What the kernel attribute declared.
    pub fn facts(&self) -> &'static KernelFacts {
        self.facts
    }

    /// Static shared memory per block, as the driver reports it (the emulator learns it
    /// during the launch, and reports 0 here).
    pub fn static_smem_bytes(&self) -> u32 {
        self.cuda.as_ref().map_or(0, |cuda| cuda.static_smem)
    }

    /// The driver's function handle (None on the emulator).
    pub fn cu_function(&self) -> Option<sys::CUfunction> {
        self.cuda.as_ref().map(|cuda| cuda.function.cu_function())
    }

    /// Checks `config` against the kernel's facts and the device (see [`config::plan`]).
    pub fn plan(&self, config: &LaunchConfig) -> Result<LaunchPlan> {
        config::plan(self.facts, self.static_smem_bytes(), self.smem_limit, config)
            .map_err(|reason| Error::InvalidLaunch { kernel: self.facts.name, reason })
    }

    fn on_gpu(&self) -> Result<&CudaKernel> {
        self.cuda.as_ref().ok_or(Error::WrongBackend)
    }

    /// Most clusters of `plan`'s shape that can be resident at once (`cuOccupancyMaxActiveClusters`).
    pub fn max_active_clusters(&self, stream: &Stream, plan: &LaunchPlan) -> Result<u32> {
        let (cuda, stream) = (self.on_gpu()?, stream.cuda().ok_or(Error::WrongBackend)?);
        cuda.prepare(self.facts, plan)?;
        let mut attributes = [cluster_attribute(plan.cluster.unwrap_or_default())];
        let launch = launch_config(stream, plan, &mut attributes);
        let mut count = 0i32;
        // SAFETY: `launch` and the attributes it points to live across the call.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut count, cuda.function.cu_function(), &launch) }
            .result()
            .driver("cuOccupancyMaxActiveClusters", Some(self.facts.name))?;
        Ok(count as u32)
    }

    /// Most blocks of `plan`'s configuration the GPU holds at once: blocks per SM (or clusters
    /// per GPU, for a cluster launch) from the occupancy API, times SMs (or blocks per
    /// cluster). On the emulator, which runs a persistent launch's blocks all at once, any grid.
    pub fn max_resident_blocks(&self, stream: &Stream, plan: &LaunchPlan) -> Result<u64> {
        let Some(cuda) = &self.cuda else { return Ok(u64::MAX) };
        if let Some(cluster) = plan.cluster {
            return Ok(self.max_active_clusters(stream, plan)? as u64 * cluster.volume());
        }
        cuda.prepare(self.facts, plan)?;
        let mut per_sm = 0i32;
        let threads = plan.block.volume() as i32;
        // SAFETY: a query on a live function handle.
        unsafe { sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, cuda.function.cu_function(), threads, plan.dynamic_smem_bytes as usize) }
            .result()
            .driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", Some(self.facts.name))?;
        Ok(per_sm as u64 * crate::gpu::multiprocessors(&cuda.context)? as u64)
    }

    /// For a persistent kernel, [`Error::NotCoResident`] unless the GPU holds `plan`'s whole
    /// grid at once (checked once per configuration).
    fn check_co_resident(&self, stream: &Stream, plan: &LaunchPlan) -> Result<()> {
        let Some(cuda) = self.cuda.as_ref().filter(|_| self.facts.persistent) else { return Ok(()) };
        let mut checked = cuda.co_resident.lock().unwrap_or_else(|e| e.into_inner());
        if checked.contains(plan) {
            return Ok(());
        }
        let (blocks, resident) = (plan.grid.volume(), self.max_resident_blocks(stream, plan)?);
        if blocks > resident {
            return Err(Error::NotCoResident { kernel: self.facts.name, blocks, resident });
        }
        checked.push(*plan);
        Ok(())
    }

    /// Launches with parameter slots `params` on a GPU: `cuLaunchKernel`, or
    /// `cuLaunchKernelEx` with launch attributes when the plan has a cluster (its dimension)
    /// or is programmatic (programmatic stream serialization).
    /// While a [`Recording`](crate::Recording) runs, the launch is logged; otherwise that
    /// costs one relaxed atomic load.
    ///
    /// # Safety
    /// 1. `params` has one slot per PTX parameter of the entry, in order, each pointing to a
    ///    value of that parameter's type, alive for the call.
    /// 2. Device pointers among them point to allocations that stay alive, with the lengths
    ///    passed, until the kernel completes on `stream`.
    /// 3. `plan` satisfies [`Kernel::plan`]'s checks for this kernel.
    pub unsafe fn launch_raw(&self, stream: &Stream, plan: &LaunchPlan, params: &mut [*mut c_void]) -> Result<()> {
        let (cuda, cu_stream) = (self.on_gpu()?, stream.cuda().ok_or(Error::WrongBackend)?);
        if !Arc::ptr_eq(&cuda.context, cu_stream.context()) {
            return Err(Error::WrongBackend);
        }
        cuda.prepare(self.facts, plan)?;
        self.check_co_resident(stream, plan)?;
        if let Some(recorder) = stream.recording() {
            // SAFETY: the caller's guarantees, passed on.
            return recorder.launch(self.facts.name, plan, stream, || unsafe { cuda.submit(self.facts.name, cu_stream, plan, params) });
        }
        cuda.submit(self.facts.name, cu_stream, plan, params)
    }

    /// What typed launchers call: on a GPU, [`Kernel::launch_raw`] with `params`; on the
    /// emulator, `emulated` (the kernel's host build, called with the same arguments) as
    /// every thread of the grid, which returns when the grid has finished.
    ///
    /// # Safety
    /// 1. As for [`Kernel::launch_raw`]; `buffers` lists every buffer among the arguments as
    ///    `(address, bytes, parameter name)`, and `emulated` passes exactly the arguments
    ///    `params` points to.
    #[doc(hidden)]
    pub unsafe fn launch_lowered(
        &self,
        stream: &Stream,
        plan: &LaunchPlan,
        params: &mut [*mut c_void],
        buffers: &[(u64, usize, &'static str)],
        emulated: &(dyn Fn() + Sync),
    ) -> Result<()> {
        if self.cuda.is_some() {
            return self.launch_raw(stream, plan, params);
        }
        if stream.cuda().is_some() {
            return Err(Error::WrongBackend);
        }
        let launch = emu::Launch {
            kernel: self.facts.name,
            grid: plan.grid,
            block: plan.block,
            cluster: plan.cluster.unwrap_or_default(),
            dynamic_smem_bytes: plan.dynamic_smem_bytes,
            smem_limit: self.smem_limit,
            buffers,
            co_resident: self.facts.persistent,
        };
        let run = || emu::run(&launch, emulated).map_err(Error::Emulator);
        match stream.recording() {
            None => run(),
            Some(recorder) => recorder.launch(self.facts.name, plan, stream, run),
        }
    }
}

impl CudaKernel {
    /// Submits the launch to the driver.
    ///
    /// # Safety
    /// 1. As for [`Kernel::launch_raw`], and [`CudaKernel::prepare`] has run for `plan`.
    unsafe fn submit(&self, kernel: &'static str, stream: &CudaStream, plan: &LaunchPlan, params: &mut [*mut c_void]) -> Result<()> {
        let function = self.function.cu_function();
        let (grid, block) = (plan.grid, plan.block);
        let mut attributes = [cluster_attribute(Dim3::default()); 2];
        let result = match launch_attributes(plan, &mut attributes) {
            0 => sys::cuLaunchKernel(
                function,
                grid.x,
                grid.y,
                grid.z,
                block.x,
                block.y,
                block.z,
                plan.dynamic_smem_bytes,
                stream.cu_stream(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            ),
            count => {
                let launch = launch_config(stream, plan, &mut attributes[..count]);
                sys::cuLaunchKernelEx(&launch, function, params.as_mut_ptr(), std::ptr::null_mut())
            }
        };
        result.result().driver("cuLaunchKernel", Some(kernel))
    }

    /// Makes the GPU's context current on this thread, and sets the function attributes
    /// the plan needs where they differ: the dynamic shared memory opt-in and the
    /// non-portable cluster size (raised once, never lowered), and the shared memory
    /// carveout (at its maximum for a plan capped in blocks per SM, else the driver's
    /// default).
    fn prepare(&self, facts: &KernelFacts, plan: &LaunchPlan) -> Result<()> {
        self.context.bind_to_thread().driver("cuCtxSetCurrent", Some(facts.name))?;
        let function = self.function.cu_function();
        let set = |attribute: Attr, value: i32, call: &'static str| {
            // SAFETY: sets an attribute of a live function handle.
            unsafe { sys::cuFuncSetAttribute(function, attribute, value) }.result().driver(call, Some(facts.name))
        };
        let mut current = self.attributes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if plan.dynamic_smem_bytes > current.dynamic_smem {
            set(Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, plan.dynamic_smem_bytes as i32, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")?;
            current.dynamic_smem = plan.dynamic_smem_bytes;
        }
        if plan.non_portable_cluster() && !current.non_portable_cluster {
            set(Attr::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1, "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")?;
            current.non_portable_cluster = true;
        }
        if plan.max_shared_carveout != current.max_shared_carveout {
            let carveout = if plan.max_shared_carveout { sys::CUshared_carveout::CU_SHAREDMEM_CARVEOUT_MAX_SHARED } else { sys::CUshared_carveout::CU_SHAREDMEM_CARVEOUT_DEFAULT };
            set(Attr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carveout as i32, "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")?;
            current.max_shared_carveout = plan.max_shared_carveout;
        }
        Ok(())
    }
}

fn cluster_attribute(cluster: Dim3) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
        pad: [0; 4],
        value: sys::CUlaunchAttributeValue {
            clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 { x: cluster.x, y: cluster.y, z: cluster.z },
        },
    }
}

/// Writes the launch attributes `plan` needs to the front of `attributes` and returns how
/// many: the cluster dimension, and programmatic stream serialization (CUDA Programming
/// Guide, "Programmatic Dependent Launch and Synchronization").
fn launch_attributes(plan: &LaunchPlan, attributes: &mut [sys::CUlaunchAttribute; 2]) -> usize {
    let mut count = 0;
    if let Some(cluster) = plan.cluster {
        attributes[count] = cluster_attribute(cluster);
        count += 1;
    }
    if plan.programmatic {
        attributes[count] = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue { programmaticStreamSerializationAllowed: 1 },
        };
        count += 1;
    }
    count
}

fn launch_config(stream: &CudaStream, plan: &LaunchPlan, attributes: &mut [sys::CUlaunchAttribute]) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: plan.grid.x,
        gridDimY: plan.grid.y,
        gridDimZ: plan.grid.z,
        blockDimX: plan.block.x,
        blockDimY: plan.block.y,
        blockDimZ: plan.block.z,
        sharedMemBytes: plan.dynamic_smem_bytes,
        hStream: stream.cu_stream(),
        attrs: attributes.as_mut_ptr(),
        numAttrs: attributes.len() as u32,
    }
}
