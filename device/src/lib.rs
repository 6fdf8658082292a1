//! clusterfuse's device library: what kernels call.
//!
//! Organised by execution scope ([`thread`], [`warp`], [`warpgroup`], [`block`], [`grid`]) and
//! memory space ([`shared`], [`global`]), with the warp's tensor cores in [`mma`], the
//! warpgroup's (`wgmma`) in [`warpgroup`] and TMA loads and pipelines in [`tma`]; call sites read
//! scope-then-operation, `warp::reduce_sum(x)`, `block::sync()`. Everything is built from [`arch`], one function per PTX instruction,
//! which is public so that user primitives are as fast as the built-in ones.
//!
//! The whole library also compiles for the host, where kernels run on the CPU emulator
//! ([`emu`]); only [`arch`] differs between the two. [`limits`], [`Dim3`] and [`DeviceCopy`]
//! are shared with the macros and the host runtime.
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(asm_experimental_arch, f16))]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

mod dim3;
mod half;
pub mod limits;
pub mod ops;

pub use dim3::Dim3;
pub use half::{bf16, f16, HalfFloat};

pub mod arch;
pub mod block;
pub mod cluster;
#[cfg(not(target_arch = "nvptx64"))]
pub mod emu;
pub mod global;
pub mod grid;
pub mod math;
pub mod mbarrier;
pub mod mma;
pub mod packed;
pub mod shared;
pub mod thread;
pub mod tma;
pub mod warp;
pub mod warpgroup;

/// A value that may be passed to a kernel by value: plain bits, no pointers to host memory,
/// the same layout on the host and the GPU.
///
/// # Safety
/// 1. The type is `Copy`, has no padding that the kernel reads, and means the same on the
///    host and on the GPU (`#[repr(C)]` or `#[repr(transparent)]` for your own types).
/// 2. Its alignment is at most 16 bytes (rustc's nvptx back end rejects more).
pub unsafe trait DeviceCopy: Copy + Sync {}

macro_rules! device_copy {
    ($($ty:ty),*) => { $(
        // SAFETY: primitive with the same layout on both targets.
        unsafe impl DeviceCopy for $ty {}
    )* };
}

device_copy!(u8, u16, u32, u64, usize, i8, i16, i32, i64, isize, f32, f64, f16, bf16);

// SAFETY: an array of `DeviceCopy` values is one too.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}

/// Whether elements `start .. start + count` lie in `0 .. len`, with no sum that could wrap
/// (an index that wrapped below zero must fail the check, not pass it; with a constant
/// `count` the first test compares with an immediate).
#[inline(always)]
pub(crate) fn in_bounds(start: usize, count: usize, len: usize) -> bool {
    start <= usize::MAX - count && start + count <= len
}

/// Whether elements `N i .. N i + N` (16-byte vector `i`) lie in `0 .. len`, with no product
/// that could wrap (the first test compares with an immediate).
#[inline(always)]
pub(crate) fn vector_in_bounds<const N: usize>(i: usize, len: usize) -> bool {
    i < usize::MAX / N && (i + 1) * N <= len
}

/// The one out-of-line path of every bounds, alignment and rank check: `trap`, kept cold so
/// that the checks cost a compare and a branch on the hot path.
#[cold]
#[inline(never)]
pub(crate) fn out_of_bounds() -> ! {
    #[cfg(target_arch = "nvptx64")]
    arch::trap();
    #[cfg(not(target_arch = "nvptx64"))]
    emu::trap("out-of-bounds access: an index, alignment or cluster rank check failed")
}

/// Ends the kernel with `trap` (the launch reports `CUDA_ERROR_ILLEGAL_INSTRUCTION`); the
/// message is dropped so that no formatting code reaches the device.
#[cfg(all(target_arch = "nvptx64", not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
