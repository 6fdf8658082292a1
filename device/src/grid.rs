//! The grid: its extent, grid-stride loops, and programmatic dependent launch.
//!
//! A kernel launched with `LaunchConfig::programmatic` after another on the same stream may
//! start while that one still runs: as soon as every block of the first has called
//! [`launch_dependents`] (or exited). It can then do work independent of the first (load
//! weights, say) and must call [`wait_for_prerequisites`] before it reads what the first
//! writes, or writes what the first reads.

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

/// Lets the kernel launched after this one with programmatic dependent launch start once
/// every block of this grid has called it (or exited) — call it once this kernel's remaining
/// work leaves room for the dependent's. Guarantees nothing about memory: the dependent sees
/// this grid's writes only through [`wait_for_prerequisites`]. `griddepcontrol.launch_dependents`.
#[inline(always)]
pub fn launch_dependents() {
    arch::griddepcontrol_launch_dependents()
}

/// Waits until the kernel this one was launched programmatically after has completed: after
/// it, every memory operation of that grid is visible to this thread. Before it, a
/// programmatically launched kernel may only read memory the previous kernel does not write,
/// and write none that it reads or writes. Returns at once in a kernel launched in ordinary
/// stream order. `griddepcontrol.wait`.
#[inline(always)]
pub fn wait_for_prerequisites() {
    arch::griddepcontrol_wait()
}
