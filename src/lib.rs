//! # clusterfuse
//!
//! Fused GPU kernels for NVIDIA Hopper, written as ordinary Rust functions.
//!
//! A *kernel crate* holds `#[kernel]` functions. Its `build.rs` calls
//! `clusterfuse_build::build_kernels()`, which compiles the crate for `nvptx64-nvidia-cuda`
//! (sm_90a) and assembles the PTX with `ptxas`; `clusterfuse::embed_ptx!()` embeds that PTX and
//! its cubin in the host build, where each kernel becomes a module with a typed launcher:
//!
//! ```ignore
//! use clusterfuse::prelude::*;
//! clusterfuse::embed_ptx!();
//!
//! #[kernel(launch_bounds(max_threads = 256))]
//! pub fn saxpy(a: f32, x: &[f32], y: Out<f32>) {
//!     let i = thread::global_index_x();
//!     if i < y.len() {
//!         y.set(i, a.fma(x[i], y.get(i)));
//!     }
//! }
//!
//! // On the host:
//! let gpu = clusterfuse::host::Gpu::new(0)?;
//! let saxpy = saxpy::load(&gpu)?;
//! saxpy.launch(gpu.stream(), &LaunchConfig { grid: 4.into(), block: 256.into(), ..Default::default() }, 2.0, &x, &mut y)?;
//! ```
//!
//! Device code sees the whole device library ([`thread`], [`warp`], [`block`], [`grid`],
//! [`mod@shared`], [`global`], [`math`], [`arch`]); host code additionally sees [`host`].
#![cfg_attr(target_arch = "nvptx64", no_std)]

pub use clusterfuse_device::*;
pub use clusterfuse_macros::{cluster_primitive, fused_kernel, kernel, stage};

#[cfg(not(target_arch = "nvptx64"))]
pub use clusterfuse_host as host;

/// What a kernel module usually needs: `use clusterfuse::prelude::*;`.
pub mod prelude {
    pub use crate::global::Out;
    pub use crate::grid::Published;
    pub use crate::math::Fma;
    pub use crate::ops::{Max, Min, Sum};
    pub use crate::shared::SharedSlice;
    pub use crate::{bf16, f16, HalfFloat};
    pub use crate::{block, cluster, cluster_primitive, global, grid, kernel, math, shared, thread, warp};
    pub use crate::{fused_kernel, stage};
    #[cfg(not(target_arch = "nvptx64"))]
    pub use clusterfuse_host::{Gpu, LaunchConfig};
}

/// Embeds this kernel crate's PTX and cubin (built by `clusterfuse_build::build_kernels()` in
/// its `build.rs`) so that the crate's typed launchers can load it. Invoke once, at the crate root.
#[macro_export]
macro_rules! embed_ptx {
    () => {
        #[cfg(not(target_arch = "nvptx64"))]
        #[doc(hidden)]
        pub static __CLUSTERFUSE_PTX: $crate::host::Ptx =
            $crate::host::Ptx::new(env!("CARGO_PKG_NAME"), include_str!(concat!(env!("OUT_DIR"), "/clusterfuse.ptx")))
                .with_cubin(include_bytes!(concat!(env!("OUT_DIR"), "/clusterfuse.cubin")));
    };
}

/// A statically sized shared-memory array, one per call site and block, like a CUDA
/// `__shared__` variable: `let tile = shared!([f32; 256]);` gives a
/// [`SharedSlice<f32>`](crate::shared::SharedSlice) of 256 elements.
#[macro_export]
macro_rules! shared {
    ($($array:tt)*) => {
        $crate::__private::shared_array!($crate; $($array)*)
    };
}

#[doc(hidden)]
pub mod __private {
    pub use clusterfuse_macros::shared_array;
    pub use crate::global::Out;
    pub use crate::shared::SharedSlice;
    #[cfg(not(target_arch = "nvptx64"))]
    pub use clusterfuse_host as host;

    /// The `Published<T>` a persistent kernel sees for a published buffer.
    ///
    /// # Safety
    /// 1. As for [`Published::from_raw_parts`](crate::grid::Published::from_raw_parts), for
    ///    the data at `ptr` and the flags at `flags`.
    #[inline(always)]
    pub unsafe fn published<'a, T: Copy>(ptr: *mut T, len: usize, flags: *mut u32, flags_len: usize, tile: u32) -> crate::grid::Published<'a, T> {
        crate::grid::Published::from_raw_parts(Out::from_raw_parts(ptr, len), Out::from_raw_parts(flags, flags_len), tile)
    }

    /// The `&[T]` a kernel sees for an input buffer.
    ///
    /// # Safety
    /// 1. `ptr .. ptr + len` is readable device memory, aligned for `T`, not written during
    ///    the kernel.
    #[inline(always)]
    pub unsafe fn input_slice<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
        if len == 0 {
            &[]
        } else {
            core::slice::from_raw_parts(ptr, len)
        }
    }
}
