//! Warpgroup scope: four consecutive warps (128 threads, warps `4i .. 4i + 4` of the block)
//! and their asynchronous tensor cores, `wgmma.mma_async` (sm_90a).
//!
//! A [`Warpgroup`] token is obtained only through [`Warpgroup::current`], which traps unless
//! the block is whole warpgroups; the warpgroup-collective operations take it, so they cannot
//! be called where no warpgroup is defined. One [`Warpgroup::mma_m64n256k16`] computes
//! `D += A·Bᵀ` for A 64 × 16 and B 256 × 16, both K-major in shared memory as [`Operand`]
//! descriptors say, into [`AccM64N256`], 128 f32 per thread ([`Warpgroup::mma_m64n64k16`]:
//! B 64 × 16 into [`AccM64N64`], the first 32 of them; [`Warpgroup::mma_m64n8k16`]: B 8 × 16
//! into [`AccM64N8`], the first 4):
//!
//! | register `4j + v` of thread `t` | row | column |
//! |---|---|---|
//! | `j` in 0..32, `v` in 0..4 | `16 (t / 32) + (t % 32) / 4 + 8 (v / 2)` | `8j + 2 (t % 4) + v % 2` |
//!
//! The protocol (PTX ISA §9.7.15): [`Warpgroup::fence`] before the first `wgmma` that touches
//! accumulators written otherwise, the `wgmma`s, [`Warpgroup::commit`], then
//! [`Warpgroup::wait`]`::<N>()` before reading the accumulators or reusing the operands'
//! shared memory.

use crate::arch::{self, SharedWord};
use crate::limits::WARP_SIZE;
use crate::{bf16, f16, out_of_bounds};

/// Threads in a warpgroup.
pub const THREADS: u32 = 4 * WARP_SIZE;

/// The calling thread's warpgroup: a token for warpgroup-collective operations.
#[derive(Clone, Copy)]
pub struct Warpgroup {
    index: u32,
}

impl Warpgroup {
    /// The calling thread's warpgroup; traps unless the block is a whole number of
    /// warpgroups (a multiple of 128 threads), so that every warpgroup is complete.
    #[inline(always)]
    pub fn current() -> Self {
        if !crate::block::size().is_multiple_of(THREADS) {
            out_of_bounds()
        }
        Self { index: crate::thread::rank_in_block() / THREADS }
    }

    /// Its index in the block.
    #[inline(always)]
    pub fn index(self) -> u32 {
        self.index
    }

    /// The calling thread's rank in the warpgroup (0-127).
    #[inline(always)]
    pub fn thread_rank(self) -> u32 {
        crate::thread::rank_in_block() % THREADS
    }

    /// `setmaxnreg.inc`: raises this warpgroup's registers per thread to `N`.
    #[inline(always)]
    pub fn raise_registers<const N: u32>(self) {
        arch::setmaxnreg_inc::<N>()
    }

    /// `setmaxnreg.dec`: lowers this warpgroup's registers per thread to `N`.
    #[inline(always)]
    pub fn lower_registers<const N: u32>(self) {
        arch::setmaxnreg_dec::<N>()
    }

    /// `bar.sync 1 + index, 128`: waits until every thread of this warpgroup arrives, a block
    /// barrier for the warpgroup alone (the block's other warpgroups go on): shared and global
    /// memory written before it is visible to the warpgroup after it. Named barriers `1 ..=
    /// warpgroups` are the warpgroups'; a kernel that uses this uses them for nothing else.
    #[inline(always)]
    pub fn sync(self) {
        // Immediate barrier numbers, one per warpgroup a block can hold (1024 threads).
        match self.index {
            0 => arch::bar_sync_named::<1, THREADS>(),
            1 => arch::bar_sync_named::<2, THREADS>(),
            2 => arch::bar_sync_named::<3, THREADS>(),
            3 => arch::bar_sync_named::<4, THREADS>(),
            4 => arch::bar_sync_named::<5, THREADS>(),
            5 => arch::bar_sync_named::<6, THREADS>(),
            6 => arch::bar_sync_named::<7, THREADS>(),
            _ => arch::bar_sync_named::<8, THREADS>(),
        }
    }

    /// `wgmma.fence`: orders earlier accesses to accumulators before the next `wgmma`s.
    #[inline(always)]
    pub fn fence(self) {
        arch::wgmma_fence()
    }

    /// `wgmma.commit_group`: closes the group of `wgmma`s issued since the last.
    #[inline(always)]
    pub fn commit(self) {
        arch::wgmma_commit_group()
    }

    /// `wgmma.wait_group N`: at most `N` committed groups still run.
    #[inline(always)]
    pub fn wait<const N: u32>(self) {
        arch::wgmma_wait_group::<N>()
    }

    /// `wgmma.mma_async.m64n256k16` with f32 accumulators: `acc = A·Bᵀ + (accumulate ? acc : 0)`.
    ///
    /// # Safety
    /// 1. `a` and `b` describe shared memory of this block holding the operands (A 64 rows,
    ///    B 256 rows, 16 elements of K each), which nothing writes until a [`Warpgroup::wait`]
    ///    covers this `wgmma`'s group; `acc` is not read or written until then either.
    /// 2. Every thread of the warpgroup calls it together, after a [`Warpgroup::fence`].
    #[inline(always)]
    pub unsafe fn mma_m64n256k16<T: WgmmaInput>(self, a: Operand<T>, b: Operand<T>, acc: &mut AccM64N256, accumulate: bool) {
        T::wgmma_m64n256k16(a.desc, b.desc, &mut acc.values, accumulate)
    }

    /// `wgmma.mma_async.m64n64k16` with f32 accumulators: as [`Warpgroup::mma_m64n256k16`]
    /// for B 64 × 16.
    ///
    /// # Safety
    /// 1. `a` and `b` describe shared memory of this block holding the operands (A 64 rows,
    ///    B 64 rows, 16 elements of K each), which nothing writes until a [`Warpgroup::wait`]
    ///    covers this `wgmma`'s group; `acc` is not read or written until then either.
    /// 2. Every thread of the warpgroup calls it together, after a [`Warpgroup::fence`].
    #[inline(always)]
    pub unsafe fn mma_m64n64k16<T: WgmmaInput>(self, a: Operand<T>, b: Operand<T>, acc: &mut AccM64N64, accumulate: bool) {
        T::wgmma_m64n64k16(a.desc, b.desc, &mut acc.values, accumulate)
    }

    /// `wgmma.mma_async.m64n8k16` with f32 accumulators: as [`Warpgroup::mma_m64n256k16`]
    /// for B 8 × 16 (a product with at most 8 columns, such as a few tokens).
    ///
    /// # Safety
    /// 1. `a` and `b` describe shared memory of this block holding the operands (A 64 rows,
    ///    B 8 rows, 16 elements of K each), which nothing writes until a [`Warpgroup::wait`]
    ///    covers this `wgmma`'s group; `acc` is not read or written until then either.
    /// 2. Every thread of the warpgroup calls it together, after a [`Warpgroup::fence`].
    #[inline(always)]
    pub unsafe fn mma_m64n8k16<T: WgmmaInput>(self, a: Operand<T>, b: Operand<T>, acc: &mut AccM64N8, accumulate: bool) {
        T::wgmma_m64n8k16(a.desc, b.desc, &mut acc.values, accumulate)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::f16 {}
    impl Sealed for crate::bf16 {}
}

/// An input type of `wgmma` with f32 accumulators: [`struct@f16`] or [`bf16`].
pub trait WgmmaInput: sealed::Sealed + SharedWord {
    /// `wgmma.mma_async.sync.aligned.m64n256k16.f32.{T}.{T}` on raw descriptors.
    ///
    /// # Safety
    /// As [`Warpgroup::mma_m64n256k16`].
    unsafe fn wgmma_m64n256k16(a: u64, b: u64, d: &mut [f32; 128], accumulate: bool);

    /// `wgmma.mma_async.sync.aligned.m64n64k16.f32.{T}.{T}` on raw descriptors.
    ///
    /// # Safety
    /// As [`Warpgroup::mma_m64n64k16`].
    unsafe fn wgmma_m64n64k16(a: u64, b: u64, d: &mut [f32; 32], accumulate: bool);

    /// `wgmma.mma_async.sync.aligned.m64n8k16.f32.{T}.{T}` on raw descriptors.
    ///
    /// # Safety
    /// As [`Warpgroup::mma_m64n8k16`].
    unsafe fn wgmma_m64n8k16(a: u64, b: u64, d: &mut [f32; 4], accumulate: bool);

    /// `x` and `y` rounded to this type in one `cvt.rn.{T}x2.f32`, `x` first in memory.
    fn pair_from_f32(x: f32, y: f32) -> [Self; 2];
}

impl WgmmaInput for bf16 {
    #[inline(always)]
    unsafe fn wgmma_m64n256k16(a: u64, b: u64, d: &mut [f32; 128], accumulate: bool) {
        arch::wgmma_mma_async_m64n256k16_f32_bf16_bf16(a, b, d, accumulate)
    }

    #[inline(always)]
    unsafe fn wgmma_m64n64k16(a: u64, b: u64, d: &mut [f32; 32], accumulate: bool) {
        arch::wgmma_mma_async_m64n64k16_f32_bf16_bf16(a, b, d, accumulate)
    }

    #[inline(always)]
    unsafe fn wgmma_m64n8k16(a: u64, b: u64, d: &mut [f32; 4], accumulate: bool) {
        arch::wgmma_mma_async_m64n8k16_f32_bf16_bf16(a, b, d, accumulate)
    }

    #[inline(always)]
    fn pair_from_f32(x: f32, y: f32) -> [Self; 2] {
        // SAFETY: two 2-byte values, the first in the lower half (little-endian).
        unsafe { core::mem::transmute::<u32, [Self; 2]>(arch::cvt_rn_bf16x2_f32(y, x)) }
    }
}

impl WgmmaInput for f16 {
    #[inline(always)]
    unsafe fn wgmma_m64n256k16(a: u64, b: u64, d: &mut [f32; 128], accumulate: bool) {
        arch::wgmma_mma_async_m64n256k16_f32_f16_f16(a, b, d, accumulate)
    }

    #[inline(always)]
    unsafe fn wgmma_m64n64k16(a: u64, b: u64, d: &mut [f32; 32], accumulate: bool) {
        arch::wgmma_mma_async_m64n64k16_f32_f16_f16(a, b, d, accumulate)
    }

    #[inline(always)]
    unsafe fn wgmma_m64n8k16(a: u64, b: u64, d: &mut [f32; 4], accumulate: bool) {
        arch::wgmma_mma_async_m64n8k16_f32_f16_f16(a, b, d, accumulate)
    }

    #[inline(always)]
    fn pair_from_f32(x: f32, y: f32) -> [Self; 2] {
        // SAFETY: two 2-byte values, the first in the lower half (little-endian).
        unsafe { core::mem::transmute::<u32, [Self; 2]>(arch::cvt_rn_f16x2_f32(y, x)) }
    }
}

/// Where the 128-byte swizzle ([`Operand::k_major_swizzle_128b`], TMA's `SWIZZLE_128B`)
/// keeps byte `offset` of a 1024-byte-aligned tile of 128-byte rows: its 16-byte chunk
/// XOR the row's place in its group of 8. For a kernel that writes such an operand itself.
#[inline(always)]
pub const fn swizzle_128b(offset: u32) -> u32 {
    offset ^ ((offset >> 7) & 7) << 4
}

/// A `wgmma` operand in shared memory: its matrix descriptor (PTX ISA §9.7.15.5.1).
pub struct Operand<T> {
    desc: u64,
    _element: core::marker::PhantomData<T>,
}

impl<T> Clone for Operand<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Operand<T> {}

impl<T: WgmmaInput> Operand<T> {
    /// A K-major tile with the 128-byte swizzle, as TMA writes a box 64 elements (128 bytes)
    /// wide: row `r` at `tile + 128 r`, its 16-byte chunks permuted by `r % 8`; `k0` (a
    /// multiple of 16 below 64) picks the 16 columns of K this `wgmma` reads. `tile` must be
    /// 1024-byte aligned.
    #[inline(always)]
    pub fn k_major_swizzle_128b(tile: u32, k0: u32) -> Self {
        if !tile.is_multiple_of(1024) || !k0.is_multiple_of(16) || k0 >= 64 {
            out_of_bounds()
        }
        // Groups of 8 rows 1024 bytes apart (SBO); LBO is unused for swizzled K-major tiles
        // (1 by convention); swizzle mode 1 = 128 bytes.
        let desc = arch::wgmma_descriptor_address(tile + 2 * k0) | 1 << 16 | (1024u64 >> 4) << 32 | 1 << 62;
        Self { desc, _element: core::marker::PhantomData }
    }

    /// A K-major tile with the 64-byte swizzle, as TMA writes a box 32 elements (64 bytes)
    /// wide: row `r` at `tile + 64 r`, its 16-byte chunks permuted by `r / 2 % 4`; `k0` (0 or
    /// 16) picks the 16 columns of K this `wgmma` reads. `tile` must be 512-byte aligned.
    #[inline(always)]
    pub fn k_major_swizzle_64b(tile: u32, k0: u32) -> Self {
        if !tile.is_multiple_of(512) || !k0.is_multiple_of(16) || k0 >= 32 {
            out_of_bounds()
        }
        // Groups of 8 rows 512 bytes apart (SBO); LBO unused; swizzle mode 2 = 64 bytes.
        let desc = arch::wgmma_descriptor_address(tile + 2 * k0) | 1 << 16 | (512u64 >> 4) << 32 | 2 << 62;
        Self { desc, _element: core::marker::PhantomData }
    }

    /// The same operand with its groups of 8 rows `bytes` apart (a multiple of 16 below 256
    /// KB) instead of packed: e.g. the tiles of several TMA boxes' planes.
    #[inline(always)]
    pub fn group_stride(self, bytes: u32) -> Self {
        if !bytes.is_multiple_of(16) || bytes >= 1 << 18 {
            out_of_bounds()
        }
        Self { desc: self.desc & !(0x3fff << 32) | u64::from(bytes >> 4) << 32, _element: core::marker::PhantomData }
    }

    /// The same operand `rows` rows further on (a multiple of 8): `rows / 8` groups of 8 rows.
    #[inline(always)]
    pub fn rows_down(self, rows: u32) -> Self {
        if !rows.is_multiple_of(8) {
            out_of_bounds()
        }
        // The group stride (SBO, in 16-byte units) is the descriptor's bits 32-45.
        let group = (self.desc >> 32) & 0x3fff;
        Self { desc: self.desc + u64::from(rows / 8) * group, _element: core::marker::PhantomData }
    }
}

/// A warpgroup's 64 × 256 f32 accumulators of `wgmma.m64n256k16`, 128 per thread.
pub struct AccM64N256 {
    pub values: [f32; 128],
}

impl AccM64N256 {
    /// All zeros.
    pub const ZERO: AccM64N256 = AccM64N256 { values: [0.0; 128] };

    /// (row, column) in the 64 × 256 tile of register `i` of warpgroup thread `t`.
    #[inline(always)]
    pub fn position(t: u32, i: usize) -> (usize, usize) {
        let (t, j, v) = (t as usize, i / 4, i % 4);
        (16 * (t / 32) + t % 32 / 4 + 8 * (v / 2), 8 * j + 2 * (t % 4) + v % 2)
    }
}

/// A warpgroup's 64 × 64 f32 accumulators of `wgmma.m64n64k16`, 32 per thread, laid out as
/// [`AccM64N256`]'s first 32 registers.
pub struct AccM64N64 {
    pub values: [f32; 32],
}

impl AccM64N64 {
    /// All zeros.
    pub const ZERO: AccM64N64 = AccM64N64 { values: [0.0; 32] };
}

/// A warpgroup's 64 × 8 f32 accumulators of `wgmma.m64n8k16`, 4 per thread, laid out as
/// [`AccM64N256`]'s first 4 registers.
pub struct AccM64N8 {
    pub values: [f32; 4],
}

impl AccM64N8 {
    /// All zeros.
    pub const ZERO: AccM64N8 = AccM64N8 { values: [0.0; 4] };
}

#[cfg(test)]
mod tests {
    use super::swizzle_128b;

    #[test]
    fn the_128_byte_swizzle_permutes_a_rows_chunks_by_its_place_in_8_rows() {
        // Row 0 unchanged, row 1 swaps chunk pairs, row 7 reverses them; the byte within a
        // chunk stays, and the pattern repeats every 1024 bytes.
        assert_eq!(swizzle_128b(0x25), 0x25);
        assert_eq!(swizzle_128b(128 + 3), 128 + 16 + 3);
        assert_eq!(swizzle_128b(7 * 128), 7 * 128 + 7 * 16);
        assert_eq!(swizzle_128b(1024 + 3 * 128 + 16 + 6), 1024 + 3 * 128 + 2 * 16 + 6);
    }
}
