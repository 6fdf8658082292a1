//! The grid: its extent, grid-stride loops, and programmatic dependent launch.
//!
//! A kernel launched with `LaunchConfig::programmatic` after another on the same stream may
//! start while that one still runs: as soon as every block of the first has called
//! [`launch_dependents`] (or exited). It can then do work independent of the first (load
//! weights, say) and must call [`wait_for_prerequisites`] before it reads what the first
//! writes, or writes what the first reads.
//!
//! Inside one launch, blocks depend on each other through [`Published`] buffers (persistent
//! kernels only), and share out work by static schedules ([`round_robin`],
//! [`cluster_round_robin`]).

mod published;

pub use published::{flag_words, Published, Ready};

use crate::{arch, Dim3};
use core::iter::StepBy;
use core::ops::Range;

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

/// The tasks `0 .. count` this block takes when the grid shares them round robin from block
/// `first` on: block `first + i` (modulo the grid) of `G` takes `i, i + G, i + 2G, ...`. A
/// persistent kernel's stages, each over its own tasks in this order, cannot deadlock when a
/// task waits only on earlier stages' tasks: every block finishes a stage's tasks before it
/// waits in the next. Starting a stage where the one before ended (`first` = the previous
/// stage's `first + count`) gives its first tasks to the blocks that finish the previous
/// stage first.
#[inline(always)]
pub fn round_robin(count: u32, first: u32) -> StepBy<Range<u32>> {
    shared_out(crate::block::index_x(), arch::nctaid_x(), count, first)
}

/// The tasks `0 .. count` this block's *cluster* takes when the grid's clusters share them
/// round robin from cluster `first` on (every block of a cluster gets the same tasks, for
/// cluster-wide work).
#[inline(always)]
pub fn cluster_round_robin(count: u32, first: u32) -> StepBy<Range<u32>> {
    shared_out(arch::clusterid_x(), arch::nclusterid_x(), count, first)
}

/// Worker `me`'s tasks of `count` shared round robin by `workers` from worker `first` on.
#[inline(always)]
fn shared_out(me: u32, workers: u32, count: u32, first: u32) -> StepBy<Range<u32>> {
    let rank = (me + workers - first % workers) % workers;
    (rank.min(count)..count).step_by(workers as usize)
}
