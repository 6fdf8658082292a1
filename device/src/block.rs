//! Block scope: the block's index and extent, `syncthreads`, and block-wide reductions.

use crate::ops::{Element, Max, ReduceOp, Sum};
use crate::shared::SharedSlice;
use crate::{arch, limits::WARP_SIZE, warp, Dim3};

/// `blockIdx`: the block's index in the grid.
#[inline(always)]
pub fn index() -> Dim3 {
    Dim3::new(arch::ctaid_x(), arch::ctaid_y(), arch::ctaid_z())
}

/// `blockIdx.x`.
#[inline(always)]
pub fn index_x() -> u32 {
    arch::ctaid_x()
}

/// `blockDim`: the block's extent in threads.
#[inline(always)]
pub fn dim() -> Dim3 {
    Dim3::new(arch::ntid_x(), arch::ntid_y(), arch::ntid_z())
}

/// Threads in the block.
#[inline(always)]
pub fn size() -> u32 {
    arch::ntid_x() * arch::ntid_y() * arch::ntid_z()
}

/// Warps in the block (the last one may be partial).
#[inline(always)]
pub fn warps() -> u32 {
    size().div_ceil(WARP_SIZE)
}

/// The indices `range.start + thread::rank_in_block()`, then every [`size`]-th one below
/// `range.end`: the block's threads striding over `range` together. It counts in 32 bits
/// and divides nothing (a `usize` `step_by` costs a 64-bit division call per loop).
#[inline(always)]
pub fn stride_loop(range: core::ops::Range<usize>) -> StrideLoop {
    StrideLoop { next: range.start as u32 + crate::thread::rank_in_block(), end: range.end as u32, step: size() }
}

/// The iterator of [`stride_loop`].
pub struct StrideLoop {
    next: u32,
    end: u32,
    step: u32,
}

impl Iterator for StrideLoop {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        let i = self.next;
        if i >= self.end {
            return None;
        }
        self.next = i.saturating_add(self.step);
        Some(i as usize)
    }
}

/// `__syncthreads()`: every thread of the block waits here; shared and global memory
/// written before it is visible to the whole block after it.
#[inline(always)]
pub fn sync() {
    arch::bar_sync()
}

/// All-reduce over the block with `op`: every thread gets the result.
///
/// Each warp reduces by shuffles, lane 0 of each warp leaves its partial in `scratch`
/// (at least [`warps`] elements), and every warp reduces the partials in the same order,
/// so the result is deterministic and the same in every thread. The block size must be a
/// multiple of 32. Every thread of the block must call it (it contains barriers); it ends
/// with a barrier, so `scratch` may be reused at once.
#[inline(always)]
pub fn reduce<T: Element + crate::arch::SharedWord, Op: ReduceOp<T>>(value: T, op: Op, scratch: SharedSlice<T>) -> T {
    let partial = warp::reduce(value, op);
    let warp_index = warp::index_in_block();
    if warp::lane() == 0 {
        scratch.store(warp_index as usize, partial);
    }
    sync();
    let lane = warp::lane();
    let mine = if lane < warps() { scratch.load(lane as usize) } else { Op::identity() };
    let total = warp::reduce(mine, op);
    sync();
    total
}

/// Sum over the block; every thread gets it. See [`reduce`].
#[inline(always)]
pub fn reduce_sum<T: Element + crate::arch::SharedWord>(value: T, scratch: SharedSlice<T>) -> T {
    reduce(value, Sum, scratch)
}

/// Maximum over the block; every thread gets it. See [`reduce`].
#[inline(always)]
pub fn reduce_max<T: Element + crate::arch::SharedWord>(value: T, scratch: SharedSlice<T>) -> T {
    reduce(value, Max, scratch)
}
