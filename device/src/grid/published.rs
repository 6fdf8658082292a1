//! Dependencies between the blocks of one launch, through global memory: a buffer that some
//! blocks write tile by tile and publish, and others wait for, tile by tile.
//!
//! A block that writes a tile [`publishes`](Published::publish) it: a barrier, then a
//! `st.release.gpu` of the launch's generation to the tile's flag, so every write the block
//! made before is released with it. A block that reads tiles [`waits`](Published::wait) for
//! them: its threads poll the tiles' flags, four to a 16-byte `ld.acquire.gpu` (backing off
//! with `nanosleep`), until each holds the generation, then a barrier, so the whole block sees
//! what the publishers released. The wait hands out the only way to read a range: [`Ready`], a
//! view of exactly the elements waited for. A thread that waits apart from its block (one of
//! a warpgroup that consumes a pipeline, say) polls alone, no barrier
//! ([`Published::wait_alone`]); one thread reads one element with [`Published::get`], which
//! waits for its tile alone. There is no read without a wait.
//!
//! Each tile is published once per launch: a value that changes over a launch (the residual
//! stream, layer after layer) takes a region per version, so that no block overwrites what
//! another may still read. Blocks that wait on each other must all be resident at once, or
//! the waiting ones can hold the SMs the publishing ones need: such a buffer is a parameter of
//! a `#[kernel(persistent, ..)]` only, whose launch checks that the GPU holds its whole grid.
//!
//! Flags are never cleared: each launch publishes its own *generation*, read from the buffer
//! as the kernel starts and advanced by the last block to [`retire`](Published::retire) (the
//! launcher `#[kernel(persistent)]` generates retires every `Published` parameter), so the
//! next launch, a CUDA graph's replay included, finds none of its tiles published. The read
//! comes after [`wait_for_prerequisites`](crate::grid::wait_for_prerequisites): a kernel
//! launched programmatically after the buffer's previous user (itself, step after step) reads
//! the generation that user's last block left, not one it has yet to advance.

use crate::global::{Coherent, Out};
use crate::{arch, block, out_of_bounds, thread};
use core::ops::Range;

/// Back-off between two polls of an unpublished flag.
const SPIN_NS: u32 = 32;

/// Words after the tile flags: the epoch and the count of retired blocks (16 bytes, so that
/// the flags stay in whole 16-byte groups).
const TAIL: usize = 4;

/// Flag words for `tiles` tiles: whole groups of four, then four more (the epoch, the count
/// of retired blocks, two unused).
pub const fn flag_words(tiles: usize) -> usize {
    tiles.next_multiple_of(4) + TAIL
}

/// A global buffer published tile by tile within one launch: `len` values of `T` in tiles of
/// `tile` values, a flag per tile, the epoch and the count of retired blocks. A kernel
/// parameter of persistent kernels; the host passes a `host::Published<T>`.
pub struct Published<'a, T> {
    data: Out<'a, T>,
    flags: Out<'a, u32>,
    tile: usize,
    tiles: usize,
    /// The value a tile's flag holds once published in this launch: the epoch plus 1,
    /// never 0 (what new flags hold).
    generation: u32,
}

impl<'a, T: Copy> Published<'a, T> {
    /// The buffer `data`, in tiles of `tile` values, with `flags` ([`flag_words`] of the tile
    /// count, the first launch's all zero). Waits for the kernel this one was launched
    /// programmatically after ([`wait_for_prerequisites`](crate::grid::wait_for_prerequisites);
    /// at once in stream order), then reads the launch's generation. Traps unless `tile > 0`
    /// and the flags have that length and 16-byte alignment.
    ///
    /// # Safety
    /// 1. As for [`Out::from_raw_parts`], for both buffers.
    /// 2. Every block of the grid retires the buffer once, last ([`Published::retire`]).
    #[inline(always)]
    pub unsafe fn from_raw_parts(data: Out<'a, T>, flags: Out<'a, u32>, tile: u32) -> Self {
        let tile = tile as usize;
        if tile == 0 {
            out_of_bounds()
        }
        let tiles = data.len().div_ceil(tile);
        if flags.len() != flag_words(tiles) || !(flags.as_mut_ptr() as usize).is_multiple_of(16) {
            out_of_bounds()
        }
        // The previous launch on the buffer may be the kernel this one follows under
        // programmatic dependent launch: its last block advances the epoch as it exits.
        crate::grid::wait_for_prerequisites();
        // SAFETY: the epoch word, in bounds (checked above). Relaxed: it changes only once
        // every block of this launch has retired, after this read.
        let epoch = unsafe { arch::ld_relaxed_gpu_global_u32(flags.as_mut_ptr().add(tiles.next_multiple_of(4))) };
        Self { data, flags, tile, tiles, generation: epoch % u32::MAX + 1 }
    }

    /// Values in the buffer.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the buffer holds no values.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Values per tile (the last tile may be shorter).
    #[inline(always)]
    pub fn tile_len(&self) -> usize {
        self.tile
    }

    /// Tiles in the buffer.
    #[inline(always)]
    pub fn tiles(&self) -> usize {
        self.tiles
    }

    /// The tiles that hold `range`.
    #[inline(always)]
    pub fn tiles_of(&self, range: Range<usize>) -> Range<usize> {
        if range.start >= range.end {
            return 0..0;
        }
        range.start / self.tile..(range.end - 1) / self.tile + 1
    }

    /// Stores `value` at element `i` (of a tile this block publishes later); traps when out
    /// of bounds.
    #[inline(always)]
    pub fn set(&self, i: usize, value: T) {
        self.data.set(i, value)
    }

    /// Stores elements `N * i .. N * i + N` in one 16-byte store; traps when out of bounds or
    /// misaligned.
    #[inline(always)]
    pub fn store16<const N: usize>(&self, i: usize, values: [T; N]) {
        self.data.store16(i, values)
    }

    /// Publishes `tiles`, which this block has written: a block barrier (every thread of the
    /// block calls it), then a release per tile. Traps when a tile is out of range.
    #[inline(always)]
    pub fn publish(&self, tiles: Range<usize>) {
        block::sync();
        for tile in block::stride_loop(tiles) {
            // SAFETY: a live, aligned `u32` of the flags (bounds checked by `flag`).
            unsafe { arch::st_release_gpu_global_u32(self.flag(tile), self.generation) };
        }
    }

    /// Waits until the tiles holding `range` are published, and returns them for reading:
    /// every thread of the block calls it (it ends with a block barrier). Traps when the
    /// range is out of bounds.
    #[inline(always)]
    pub fn wait(&self, range: Range<usize>) -> Ready<'_, T> {
        if range.end > self.len() {
            out_of_bounds()
        }
        let tiles = self.tiles_of(range.clone());
        for group in block::stride_loop(tiles.start / 4..tiles.end.div_ceil(4)) {
            self.poll(group, tiles.clone());
        }
        block::sync();
        Ready { data: &self.data, range }
    }

    /// [`Published::wait`] for this thread alone, no barrier: for threads that wait apart
    /// from the rest of their block (a warpgroup consuming a pipeline, say). Only this thread
    /// may read the returned elements. Traps when the range is out of bounds.
    #[inline(always)]
    pub fn wait_alone(&self, range: Range<usize>) -> Ready<'_, T> {
        if range.end > self.len() {
            out_of_bounds()
        }
        let tiles = self.tiles_of(range.clone());
        for group in tiles.start / 4..tiles.end.div_ceil(4) {
            self.poll(group, tiles.clone());
        }
        Ready { data: &self.data, range }
    }

    /// Polls flag group `group` (tiles `4 · group ..`, four to a 16-byte acquire) until those
    /// of `tiles` in it are published.
    #[inline(always)]
    fn poll(&self, group: usize, tiles: Range<usize>) {
        // SAFETY: a 16-byte group of the flags, in bounds (callers pass groups of `tiles_of`
        // a range in bounds; whole groups precede the tail) and aligned (checked at
        // construction).
        let flags = unsafe { self.flags.as_mut_ptr().add(4 * group) } as *const [u32; 4];
        loop {
            // SAFETY: as above.
            let words = unsafe { arch::ld_acquire_gpu_global_v4_u32(flags) };
            let waited = |j: usize| tiles.contains(&(4 * group + j));
            if (0..4).all(|j| !waited(j) || words[j] == self.generation) {
                break;
            }
            arch::nanosleep(SPIN_NS);
        }
    }

    /// Element `i`, once its tile is published: this thread alone waits (for a few elements
    /// a thread reads, such as its rows' residual). Traps when out of bounds.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        if i >= self.len() {
            out_of_bounds()
        }
        let flag = self.flag(i / self.tile);
        // SAFETY: a live, aligned `u32` of the flags (bounds checked by `flag`).
        while unsafe { arch::ld_acquire_gpu_global_u32(flag) } != self.generation {
            arch::nanosleep(SPIN_NS);
        }
        self.data.get(i)
    }

    /// Ends this block's use of the buffer in the launch: every thread of the block calls it,
    /// once, after its last wait and publish. The last block of the grid to retire advances
    /// the epoch for the next launch.
    #[inline(always)]
    pub fn retire(&self) {
        block::sync();
        if thread::rank_in_block() == 0 {
            self.retire_finish(self.retire_arrive());
        }
    }

    /// [`Published::retire`]'s first half, for one thread of a block that has synchronised
    /// after its last wait and publish: counts the block as retired; returns the count before.
    #[doc(hidden)]
    #[inline(always)]
    pub fn retire_arrive(&self) -> u32 {
        // SAFETY: the retired count, in bounds (the tail). Acquire-release: the last block
        // sees every other block's waits and publishes as done.
        unsafe { arch::atom_acq_rel_gpu_global_add_u32(self.tail().add(1), 1) }
    }

    /// [`Published::retire`]'s second half: in the last block, resets the count and advances
    /// the epoch.
    #[doc(hidden)]
    #[inline(always)]
    pub fn retire_finish(&self, retired_before: u32) {
        if retired_before == crate::grid::dim().volume() as u32 - 1 {
            // SAFETY: the tail's words, in bounds.
            unsafe {
                arch::st_relaxed_gpu_global_u32(self.tail().add(1), 0);
                arch::st_relaxed_gpu_global_u32(self.tail(), self.generation);
            }
        }
    }

    /// The epoch word; the retired count follows it.
    #[inline(always)]
    fn tail(&self) -> *mut u32 {
        self.flags.as_mut_ptr().wrapping_add(self.tiles.next_multiple_of(4))
    }

    /// The flag of `tile`; traps when it is out of range.
    #[inline(always)]
    fn flag(&self, tile: usize) -> *mut u32 {
        if tile >= self.tiles {
            out_of_bounds()
        }
        self.flags.as_mut_ptr().wrapping_add(tile)
    }
}

// Every thread of the grid holds the same two buffers: copying the handle copies no data.
impl<T: Copy> Clone for Published<'_, T> {
    fn clone(&self) -> Self {
        // SAFETY: the same buffers, under the same contract.
        let (data, flags) = unsafe {
            (Out::from_raw_parts(self.data.as_mut_ptr(), self.data.len()), Out::from_raw_parts(self.flags.as_mut_ptr(), self.flags.len()))
        };
        Self { data, flags, ..*self }
    }
}

/// Published elements a block waited for: reads of `range` only, through the coherent path
/// (the read-only path may serve a line cached before the wait).
pub struct Ready<'p, T> {
    data: &'p Out<'p, T>,
    range: Range<usize>,
}

impl<T: Copy> Ready<'_, T> {
    /// The elements waited for.
    #[inline(always)]
    pub fn range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// Element `i`; traps outside the range waited for.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        if !self.range.contains(&i) {
            out_of_bounds()
        }
        self.data.get(i)
    }

    /// Elements `N * i .. N * i + N` in one 16-byte load; traps unless all lie in the range
    /// waited for (or when misaligned).
    #[inline(always)]
    pub fn load16<const N: usize>(&self, i: usize) -> [T; N] {
        if N * i < self.range.start || N * i + N > self.range.end {
            out_of_bounds()
        }
        self.data.load16(i)
    }
}

impl<T: Copy> Coherent<T> for Ready<'_, T> {
    #[inline(always)]
    fn get(&self, i: usize) -> T {
        Ready::get(self, i)
    }

    #[inline(always)]
    fn load16<const N: usize>(&self, i: usize) -> [T; N] {
        Ready::load16(self, i)
    }
}
