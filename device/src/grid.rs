//! The grid: its extent, and grid-stride loops.

use crate::{arch, Dim3};

/// `gridDim`: the grid's extent in blocks.
#[inline(always)]
pub fn dim() -> Dim3 {
    Dim3::new(arch::nctaid_x(), arch::nctaid_y(), arch::nctaid_z())
}

/// Threads along x in the whole grid: the stride of a grid-stride loop.
#[inline(always)]
pub fn stride_x() -> usize {
    arch::nctaid_x() as usize * arch::ntid_x() as usize
}

/// The indices `global_index_x(), + stride_x(), ...` below `len`: a grid-stride loop.
#[inline(always)]
pub fn stride_loop_x(len: usize) -> impl Iterator<Item = usize> {
    (crate::thread::global_index_x()..len).step_by(stride_x())
}
