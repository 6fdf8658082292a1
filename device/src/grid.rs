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
//! [`cluster_round_robin`], and [`StreamK`] for items of many steps).

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

/// *Stream-K*: `items` items (output tiles) of `steps` steps each (their K-steps) shared by
/// `workers` blocks as equal contiguous ranges of the flat `item · steps + step` order, so
/// that every block streams the same number of steps whatever the item count (a round robin
/// of whole items leaves blocks idle in its last wave). A block's range falls into
/// [`Segment`]s, one an item it touches: whole items, and at its ends parts of an item that
/// other blocks finish. An item's *head* segment (its step 0) sums the others' partial
/// results: they are the first segments of the blocks after its own
/// ([`StreamK::helpers`]), done at those blocks' starts, while the head comes last in its
/// block's range — so the head rarely waits, and summing the parts in block order makes the
/// result independent of timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamK {
    items: usize,
    steps: usize,
    workers: usize,
}

/// One item's steps `steps` that one block of a [`StreamK`] schedule takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub item: usize,
    pub steps: Range<usize>,
}

impl Segment {
    /// Whether the segment holds its item's step 0: its block completes the item.
    #[inline(always)]
    pub fn is_head(&self) -> bool {
        self.steps.start == 0
    }
}

/// A block's [`Segment`]s of a [`StreamK`] schedule: a cursor in the flat step order (32-bit:
/// a lone producer thread keeps it beside its pipeline's state).
#[derive(Clone, Debug)]
pub struct Segments {
    at: u32,
    end: u32,
    steps: u32,
}

impl Iterator for Segments {
    type Item = Segment;

    #[inline(always)]
    fn next(&mut self) -> Option<Segment> {
        if self.at >= self.end {
            return None;
        }
        let (item, first) = (self.at / self.steps, self.at % self.steps);
        let last = self.steps.min(first + self.end - self.at);
        self.at += last - first;
        Some(Segment { item: item as usize, steps: first as usize..last as usize })
    }
}

impl StreamK {
    /// `items` items of `steps` steps shared by `workers` workers (none when `workers` is 0).
    #[inline(always)]
    pub const fn new(items: usize, steps: usize, workers: usize) -> Self {
        Self { items, steps, workers }
    }

    /// Whether every worker has a step: no more workers than steps. [`StreamK::helpers`]
    /// counts on it.
    #[inline(always)]
    pub const fn busies_every_worker(self) -> bool {
        self.workers <= self.items * self.steps
    }

    /// Worker `w`'s steps, in the flat order.
    #[inline(always)]
    pub fn range(self, w: usize) -> Range<usize> {
        let total = self.items * self.steps;
        let at = |w: usize| if self.workers == 0 { total } else { w.min(self.workers) * total / self.workers };
        at(w)..at(w + 1)
    }

    /// Worker `w`'s segments, in order (none for an empty range).
    #[inline(always)]
    pub fn segments(self, w: usize) -> Segments {
        let range = self.range(w);
        Segments { at: range.start as u32, end: range.end as u32, steps: self.steps as u32 }
    }

    /// The workers after `w` whose ranges start inside `segment`'s item: those whose first
    /// segments a head segment of `w` adds, in this order (none when `w` ends the item).
    /// Where some worker has no step ([`StreamK::busies_every_worker`]), it may count workers
    /// that have none.
    #[inline(always)]
    pub fn helpers(self, w: usize, segment: &Segment) -> Range<usize> {
        let end = (segment.item + 1) * self.steps;
        let mut last = w + 1;
        while last < self.workers && self.range(last).start < end {
            last += 1;
        }
        w + 1..last
    }
}

#[cfg(test)]
mod tests {
    use super::{Segment, StreamK};
    use std::{vec, vec::Vec};


    /// Every (item, step) once, each item's segments a head and the helpers' first segments.
    fn check(items: usize, steps: usize, workers: usize) {
        let schedule = StreamK::new(items, steps, workers);
        assert_eq!(schedule.busies_every_worker(), workers <= items * steps);
        if !schedule.busies_every_worker() {
            return;
        }
        let mut seen = vec![0u32; items * steps];
        for w in 0..workers {
            let range = schedule.range(w);
            assert!(range.len() <= (items * steps).div_ceil(workers), "{w}: {range:?}");
            for (n, segment) in schedule.segments(w).enumerate() {
                assert!(!segment.steps.is_empty() && segment.steps.end <= steps);
                assert!(n == 0 || segment.is_head(), "only a range's first segment starts inside an item");
                segment.steps.clone().for_each(|s| seen[segment.item * steps + s] += 1);
                if segment.is_head() {
                    let parts: Vec<Segment> = schedule.helpers(w, &segment).map(|h| schedule.segments(h).next().unwrap()).collect();
                    let mut next = segment.steps.end;
                    for part in parts {
                        assert_eq!((part.item, part.steps.start), (segment.item, next));
                        next = part.steps.end;
                    }
                    assert_eq!(next, steps, "the head and its helpers cover item {}", segment.item);
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
    }

    #[test]
    fn stream_k_covers_every_step_once_and_heads_find_their_parts() {
        for (items, steps, workers) in [(88, 64, 132), (88, 64, 120), (429, 64, 132), (16, 176, 132), (3, 5, 7), (1, 1, 4), (7, 3, 1), (1000, 2, 132), (1, 4, 132), (2, 3, 132)] {
            check(items, steps, workers);
        }
    }
}
