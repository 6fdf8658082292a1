//! Warp-scope tensor cores: `mma.sync.m16n8k16` (f16 or bf16 in, f32 accumulate), fed from
//! shared memory by `ldmatrix`.
//!
//! One `mma_m16n8k16` computes `D = A·B + C` for a 16×16 A, a 16×8 B and 16×8 C, D, each
//! spread over the 32 lanes of a warp as a *fragment*. The fragments are typed by shape and
//! input type, so a B where an A belongs, or a bf16 A with an f16 B, does not compile. In
//! every layout (PTX ISA §9.7.14.5.8) lane `l` is in group `g = l / 4` at index `t = l % 4`,
//! and a 32-bit register holds two neighbouring elements, the lower column in its low half:
//!
//! | fragment | registers | lane `l` holds |
//! |---|---|---|
//! | [`FragA`] 16×16, row-major | 4 × (2 halves) | rows `g`, `g + 8` × columns `2t, 2t+1`, `2t+8, 2t+9` (reg `r`: row `g + 8 (r % 2)`, columns `2t + 8 (r / 2)` ..+ 2) |
//! | [`FragB`] 16×8 (k × n) | 2 × (2 halves) | column `g` × rows `2t, 2t+1` (reg 0), `2t+8, 2t+9` (reg 1) |
//! | [`FragC`] 16×8, f32 | 4 | rows `g` (0, 1), `g + 8` (2, 3) × columns `2t, 2t+1` |
//!
//! The loads take a tile in shared memory with a row stride, in elements; each lane reads one
//! 16-byte row of an 8×8 matrix, so the tile's rows must start 16-byte aligned. Strides whose
//! rows fall in different banks (a row of `8 (2j + 1)` halves, e.g. 40 for a tile 32 wide)
//! keep `ldmatrix` free of bank conflicts.

use crate::arch::{self, SharedWord};
use crate::shared::SharedSlice;
use crate::{bf16, f16, out_of_bounds, warp, HalfFloat};
use core::marker::PhantomData;

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::f16 {}
    impl Sealed for crate::bf16 {}
}

/// An input type of `mma.sync.m16n8k16` with f32 accumulators: [`struct@f16`] or [`bf16`].
pub trait MmaInput: sealed::Sealed + SharedWord + HalfFloat {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{T}.{T}.f32` on raw registers.
    fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4];
    /// `lo` and `hi` rounded to `T` and packed in one register, `lo` in the low half.
    fn pack(lo: f32, hi: f32) -> u32;
}

impl MmaInput for f16 {
    #[inline(always)]
    fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        arch::mma_sync_m16n8k16_row_col_f32_f16_f16_f32(a, b, c)
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        arch::cvt_rn_f16x2_f32(hi, lo)
    }
}

impl MmaInput for bf16 {
    #[inline(always)]
    fn mma_m16n8k16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        arch::mma_sync_m16n8k16_row_col_f32_bf16_bf16_f32(a, b, c)
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        arch::cvt_rn_bf16x2_f32(hi, lo)
    }
}

/// The A operand: this lane's part of a 16×16 row-major tile of `T`.
#[derive(Clone, Copy)]
pub struct FragA<T> {
    /// The lane's registers, in the layout of the module docs.
    pub regs: [u32; 4],
    _input: PhantomData<T>,
}

/// The B operand: this lane's part of a 16×8 (k × n) tile of `T`.
#[derive(Clone, Copy)]
pub struct FragB<T> {
    /// The lane's registers, in the layout of the module docs.
    pub regs: [u32; 2],
    _input: PhantomData<T>,
}

/// The accumulator: this lane's part of a 16×8 tile of `f32`.
#[derive(Clone, Copy)]
pub struct FragC {
    /// The lane's values, in the layout of the module docs.
    pub values: [f32; 4],
}

/// `D = A·B + C` on the warp's tensor cores; every lane of the warp must call it together.
#[inline(always)]
pub fn mma_m16n8k16<T: MmaInput>(a: FragA<T>, b: FragB<T>, c: FragC) -> FragC {
    FragC { values: T::mma_m16n8k16(a.regs, b.regs, c.values) }
}

/// Checks that the `rows` × `cols` block at (`row`, `col`) of a tile with row stride
/// `stride` lies in `tile` with 16-byte-aligned rows; returns this lane's row address, at
/// (`row + lane_row`, `col + lane_col`).
#[inline(always)]
fn row_address<T: SharedWord>(tile: SharedSlice<T>, stride: usize, row: usize, col: usize, (rows, cols): (usize, usize), lane_row: usize, lane_col: usize) -> u32 {
    let size = core::mem::size_of::<T>();
    // Each under 2^31 (a tile holds far fewer elements), no product or sum below can wrap a
    // 64-bit `usize` (the GPU's, and the emulator's hosts').
    let small = (row | col | stride) >> 31 == 0;
    if !small || (row + rows - 1) * stride + col + cols > tile.len() || !(tile.addr() as usize + (row * stride + col) * size).is_multiple_of(16) || !(stride * size).is_multiple_of(16) {
        out_of_bounds()
    }
    tile.addr() + (((row + lane_row) * stride + col + lane_col) * size) as u32
}

impl<T: MmaInput> FragA<T> {
    /// A fragment from its registers.
    #[inline(always)]
    pub fn from_regs(regs: [u32; 4]) -> Self {
        Self { regs, _input: PhantomData }
    }

    /// The 16 × 16 tile whose columns 0-7 are the accumulator `left` and 8-15 `right`,
    /// rounded to `T`: a product fed to the next `mma` without leaving registers (as
    /// attention's probabilities, `P = softmax(Q·Kᵀ)`, feed `P·V`).
    #[inline(always)]
    pub fn from_accumulators(left: FragC, right: FragC) -> Self {
        let ([l0, l1, l2, l3], [r0, r1, r2, r3]) = (left.values, right.values);
        Self::from_regs([T::pack(l0, l1), T::pack(l2, l3), T::pack(r0, r1), T::pack(r2, r3)])
    }

    /// Rows `row .. row + 16`, columns `col .. col + 16` of a row-major tile with row stride
    /// `stride` elements, by one `ldmatrix.x4`. Traps when they exceed `tile` or a row is
    /// not 16-byte aligned. The whole warp must call it together with the same arguments.
    #[inline(always)]
    pub fn load(tile: SharedSlice<T>, stride: usize, row: usize, col: usize) -> Self {
        let lane = warp::lane() as usize;
        let addr = row_address(tile, stride, row, col, (16, 16), lane % 16, lane / 16 * 8);
        // SAFETY: every row the warp addresses is in `tile` and aligned (checked above).
        unsafe { Self::load_at(addr) }
    }

    /// This lane's row address for [`FragA::load_at`], in elements from the tile's
    /// (`row`, `col`): row `lane % 16`, column `8 (lane / 16)`.
    #[inline(always)]
    pub fn lane_offset(stride: usize) -> usize {
        let lane = warp::lane() as usize;
        lane % 16 * stride + lane / 16 * 8
    }

    /// [`FragA::load`] from this lane's row address, unchecked: for inner loops that checked
    /// their tiles once, and for tiles in other layouts (a swizzled one).
    ///
    /// # Safety
    /// 1. `addr` is the shared address of this lane's 16 bytes of the fragment, row
    ///    `lane % 16`, columns `8 (lane / 16) ..+ 8` (element [`FragA::lane_offset`] from the
    ///    first in a row-major tile), 16-byte aligned, in this block's shared memory, not
    ///    written concurrently.
    /// 2. Every lane of the warp calls it together.
    #[inline(always)]
    pub unsafe fn load_at(addr: u32) -> Self {
        Self::from_regs(arch::ldmatrix_sync_aligned_m8n8_x4_shared_b16(addr))
    }
}

impl<T: MmaInput> FragB<T> {
    /// A fragment from its registers.
    #[inline(always)]
    pub fn from_regs(regs: [u32; 2]) -> Self {
        Self { regs, _input: PhantomData }
    }

    /// Rows (k) `k .. k + 16`, columns (n) `n .. n + 8` of a row-major k × n tile with row
    /// stride `stride` (B as it is stored in `A·B`), by one `ldmatrix.x2.trans`. Traps as
    /// [`FragA::load`] does.
    #[inline(always)]
    pub fn load_k_major(tile: SharedSlice<T>, stride: usize, k: usize, n: usize) -> Self {
        let lane = warp::lane() as usize;
        let addr = row_address(tile, stride, k, n, (16, 8), lane % 16, 0);
        // SAFETY: checked above, as for `FragA::load`.
        unsafe { Self::load_k_major_at(addr) }
    }

    /// [`FragB::load_k_major`] from this lane's row address, unchecked.
    ///
    /// # Safety
    /// 1. `addr` is the shared address of this lane's 16 bytes of the fragment, row (k)
    ///    `lane % 16`, columns (n) `0 .. 8`, 16-byte aligned, in this block's shared memory,
    ///    not written concurrently.
    /// 2. Every lane of the warp calls it together.
    #[inline(always)]
    pub unsafe fn load_k_major_at(addr: u32) -> Self {
        Self::from_regs(arch::ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16(addr))
    }

    /// The same fragment from a row-major n × k tile (B transposed, as `nn.Linear` stores its
    /// weight), rows (n) `n .. n + 8`, columns (k) `k .. k + 16`, by one `ldmatrix.x2`.
    #[inline(always)]
    pub fn load_n_major(tile: SharedSlice<T>, stride: usize, n: usize, k: usize) -> Self {
        let lane = warp::lane() as usize;
        let addr = row_address(tile, stride, n, k, (8, 16), lane % 8, lane / 8 % 2 * 8);
        // SAFETY: checked above, as for `FragA::load`.
        unsafe { Self::load_n_major_at(addr) }
    }

    /// [`FragB::load_n_major`] from this lane's row address, unchecked.
    ///
    /// # Safety
    /// 1. `addr` is the shared address of this lane's 16 bytes of the fragment, row (n)
    ///    `lane % 8`, columns (k) `8 (lane / 8 % 2) ..+ 8` (lanes 16-31 repeat lanes 0-15),
    ///    16-byte aligned, in this block's shared memory, not written concurrently.
    /// 2. Every lane of the warp calls it together.
    #[inline(always)]
    pub unsafe fn load_n_major_at(addr: u32) -> Self {
        Self::from_regs(arch::ldmatrix_sync_aligned_m8n8_x2_shared_b16(addr))
    }

    /// Two neighbouring fragments of a row-major k × n tile, columns `n .. n + 8` and
    /// `n + 8 .. n + 16`, by one `ldmatrix.x4.trans`.
    #[inline(always)]
    pub fn load_pair_k_major(tile: SharedSlice<T>, stride: usize, k: usize, n: usize) -> [Self; 2] {
        let lane = warp::lane() as usize;
        let addr = row_address(tile, stride, k, n, (16, 16), lane % 16, lane / 16 * 8);
        // SAFETY: checked above, as for `FragA::load`.
        unsafe { Self::load_pair_k_major_at(addr) }
    }

    /// This lane's row address for [`FragB::load_pair_k_major_at`], in elements from the
    /// tile's (`k`, `n`): row `lane % 16`, column `8 (lane / 16)`.
    #[inline(always)]
    pub fn pair_lane_offset(stride: usize) -> usize {
        FragA::<T>::lane_offset(stride)
    }

    /// [`FragB::load_pair_k_major`] from this lane's row address, unchecked.
    ///
    /// # Safety
    /// 1. `addr` is the shared address of element [`FragB::pair_lane_offset`] from the
    ///    fragments' first element, in a tile of this block's shared memory holding all
    ///    16 × 16 elements, 16-byte-aligned rows, not written concurrently.
    /// 2. Every lane of the warp calls it together.
    #[inline(always)]
    pub unsafe fn load_pair_k_major_at(addr: u32) -> [Self; 2] {
        let [b0, b1, b2, b3] = arch::ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16(addr);
        [Self::from_regs([b0, b1]), Self::from_regs([b2, b3])]
    }
}

impl FragC {
    /// All zeros.
    pub const ZERO: FragC = FragC { values: [0.0; 4] };

    /// The (row, column) of this lane's value `i` in the 16×8 tile.
    #[inline(always)]
    pub fn position(i: usize) -> (usize, usize) {
        let lane = warp::lane() as usize;
        (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2)
    }
}
