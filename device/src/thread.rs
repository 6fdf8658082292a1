//! The calling thread: its index in the block and in the grid.

use crate::{arch, Dim3};

/// `threadIdx`: the thread's index in its block.
#[inline(always)]
pub fn index() -> Dim3 {
    Dim3::new(arch::tid_x(), arch::tid_y(), arch::tid_z())
}

/// `threadIdx.x`.
#[inline(always)]
pub fn index_x() -> u32 {
    arch::tid_x()
}

/// The thread's rank in its block, `x` fastest: `x + y * dim.x + z * dim.x * dim.y`.
#[inline(always)]
pub fn rank_in_block() -> u32 {
    arch::tid_x() + arch::ntid_x() * (arch::tid_y() + arch::ntid_y() * arch::tid_z())
}

/// `blockIdx.x * blockDim.x + threadIdx.x`: the thread's index along x in the whole grid.
#[inline(always)]
pub fn global_index_x() -> usize {
    arch::ctaid_x() as usize * arch::ntid_x() as usize + arch::tid_x() as usize
}
