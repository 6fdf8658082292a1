//! A kernel loaded on one GPU: its facts, planning, and the raw launch.

use crate::config::{self, LaunchConfig, LaunchPlan};
use crate::error::{DriverContext, Error, Result};
use clusterfuse_device::{DeviceCopy, Dim3};
use cudarc::driver::sys::{self, CUfunction_attribute as Attr};
use cudarc::driver::{CudaFunction, CudaModule, CudaStream};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;

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
}

/// A kernel loaded on one GPU. Typed launchers wrap it; [`Kernel::launch_raw`] is the one
/// place a launch reaches the driver.
pub struct Kernel {
    function: CudaFunction,
    facts: &'static KernelFacts,
    static_smem: u32,
    smem_limit: u32,
    /// The dynamic shared memory the function is currently allowed (48 KB until raised).
    dynamic_smem_allowed: AtomicU32,
    non_portable_allowed: AtomicBool,
    _module: Arc<CudaModule>,
}

/// A kernel parameter slot: a pointer to the value, as `cuLaunchKernel` takes it.
#[inline(always)]
pub fn param<T: DeviceCopy>(value: &T) -> *mut c_void {
    value as *const T as *mut c_void
}

impl Kernel {
    pub(crate) fn new(module: Arc<CudaModule>, function: CudaFunction, facts: &'static KernelFacts, smem_limit: u32) -> Result<Self> {
        let attr = |a| function.get_attribute(a).driver("cuFuncGetAttribute", Some(facts.name));
        let static_smem = attr(Attr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as u32;
        let dynamic_allowed = attr(Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)? as u32;
        Ok(Self {
            function,
            facts,
            static_smem,
            smem_limit,
            dynamic_smem_allowed: AtomicU32::new(dynamic_allowed),
            non_portable_allowed: AtomicBool::new(false),
            _module: module,
        })
    }

    /// What the kernel attribute declared.
    pub fn facts(&self) -> &'static KernelFacts {
        self.facts
    }

    /// Static shared memory per block, as the driver reports it.
    pub fn static_smem_bytes(&self) -> u32 {
        self.static_smem
    }

    /// The driver's function handle.
    pub fn cu_function(&self) -> sys::CUfunction {
        self.function.cu_function()
    }

    /// Checks `config` against the kernel's facts and the device (see [`config::plan`]).
    pub fn plan(&self, config: &LaunchConfig) -> Result<LaunchPlan> {
        config::plan(self.facts, self.static_smem, self.smem_limit, config)
            .map_err(|reason| Error::InvalidLaunch { kernel: self.facts.name, reason })
    }

    /// Most clusters of `plan`'s shape that can be resident at once (`cuOccupancyMaxActiveClusters`).
    pub fn max_active_clusters(&self, stream: &CudaStream, plan: &LaunchPlan) -> Result<u32> {
        self.prepare(plan)?;
        let cluster = plan.cluster.unwrap_or_default();
        let mut attribute = cluster_attribute(cluster);
        let launch = launch_config(stream, plan, &mut attribute);
        let mut count = 0i32;
        // SAFETY: `launch` and the attribute it points to live across the call.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut count, self.cu_function(), &launch) }
            .result()
            .driver("cuOccupancyMaxActiveClusters", Some(self.facts.name))?;
        Ok(count as u32)
    }

    /// Raises the function's limits the plan needs, once: the dynamic shared memory opt-in
    /// and the non-portable cluster size.
    fn prepare(&self, plan: &LaunchPlan) -> Result<()> {
        let name = Some(self.facts.name);
        if plan.dynamic_smem_bytes > self.dynamic_smem_allowed.load(Ordering::Relaxed) {
            let bytes = plan.dynamic_smem_bytes;
            // SAFETY: sets an attribute of a live function handle.
            unsafe { sys::cuFuncSetAttribute(self.cu_function(), Attr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32) }
                .result()
                .driver("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", name)?;
            self.dynamic_smem_allowed.fetch_max(bytes, Ordering::Relaxed);
        }
        if plan.non_portable_cluster() && !self.non_portable_allowed.load(Ordering::Relaxed) {
            // SAFETY: as above.
            unsafe { sys::cuFuncSetAttribute(self.cu_function(), Attr::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1) }
                .result()
                .driver("cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)", name)?;
            self.non_portable_allowed.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Launches with parameter slots `params`: `cuLaunchKernel`, or `cuLaunchKernelEx` with a
    /// cluster-dimension attribute when the plan has a cluster.
    ///
    /// # Safety
    /// 1. `params` has one slot per PTX parameter of the entry, in order, each pointing to a
    ///    value of that parameter's type, alive for the call.
    /// 2. Device pointers among them point to allocations that stay alive, with the lengths
    ///    passed, until the kernel completes on `stream`.
    /// 3. `plan` satisfies [`Kernel::plan`]'s checks for this kernel.
    pub unsafe fn launch_raw(&self, stream: &CudaStream, plan: &LaunchPlan, params: &mut [*mut c_void]) -> Result<()> {
        self.prepare(plan)?;
        let (grid, block) = (plan.grid, plan.block);
        let result = match plan.cluster {
            None => sys::cuLaunchKernel(
                self.cu_function(),
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
            Some(cluster) => {
                let mut attribute = cluster_attribute(cluster);
                let launch = launch_config(stream, plan, &mut attribute);
                sys::cuLaunchKernelEx(&launch, self.cu_function(), params.as_mut_ptr(), std::ptr::null_mut())
            }
        };
        result.result().driver("cuLaunchKernel", Some(self.facts.name))
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

fn launch_config(stream: &CudaStream, plan: &LaunchPlan, attribute: &mut sys::CUlaunchAttribute) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: plan.grid.x,
        gridDimY: plan.grid.y,
        gridDimZ: plan.grid.z,
        blockDimX: plan.block.x,
        blockDimY: plan.block.y,
        blockDimZ: plan.block.z,
        sharedMemBytes: plan.dynamic_smem_bytes,
        hStream: stream.cu_stream(),
        attrs: attribute,
        numAttrs: 1,
    }
}
