//! A GEMM on Hopper's warpgroup tensor cores: `C = epilogue(A·Bᵀ)` for row-major A (M × K)
//! and Bᵀ (N × K, as `nn.Linear` stores its weight), bf16 or f16 in, f32 accumulate, same out.
//!
//! The kernel is persistent: at most one block per SM, each computing 128 × 256 tiles of C
//! in turn, stepping through K 64 at a time through a four-stage shared-memory [`Pipeline`]
//! that runs on from tile to tile, so that one tile's epilogue overlaps the next one's loads.
//! A block has 384 threads, three warpgroups. Warpgroup 0 is
//! the producer: it gives up registers (`setmaxnreg.dec` to 40) and one of its threads issues,
//! per k-step, two TMA tile loads (A 128 × 64, Bᵀ 256 × 64, 128-byte swizzle, zero-filled past
//! the matrices' edges) that complete on the stage's *full* mbarrier. Warpgroups 1 and 2 are
//! the consumers (`setmaxnreg.inc` to 232): each waits for the stage, runs four
//! `wgmma.mma_async.m64n256k16` on its 64 rows straight from shared memory (descriptors, no
//! `ldmatrix`), then waits for the previous step's (one group stays in flight) and frees that
//! step's stage on its *empty* mbarrier. The epilogue is [`crate::gemm`]'s — none, bias,
//! bias + GELU, residual, scaling — a type parameter, so each kind is its own kernel. A tile
//! inside C is checked once ([`TileEpilogue::fetch`]): its bias is read before its main loop,
//! its residual in overlapping chunks, and its stores, two columns at a time, go unchecked
//! and branch-free; tiles at C's edges mask every store to M × N.
//!
//! Shapes: any M and N; K a multiple of 8 (TMA needs rows of A and Bᵀ in multiples of 16
//! bytes). The host rejects others before launching, with [`GemmError::Shape`](crate::gemm::GemmError::Shape).
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use clusterfuse::{bf16, host::Gpu};
//! use clusterfuse_kernels::gemm::{EpilogueKind, HostOperands, Operands};
//! use clusterfuse_kernels::wgmma_gemm::{transpose, Kernels, Maps};
//!
//! let gpu = Gpu::new(0)?;
//! let (m, n, k) = (4096, 4096, 4096);
//! let host = HostOperands::<bf16>::random(&mut rand::rng(), m, n, k);
//! let x = Operands::upload(&gpu, &host)?;
//! let bt = gpu.upload(&transpose(&host.b, k, n))?; // Bᵀ, N × K, as nn.Linear stores it
//! let mut c = gpu.zeros::<bf16>(m * n)?;
//! let maps = Maps::new(&gpu, &x.a, &bt, (m, n, k))?; // TMA descriptors of A and Bᵀ
//! Kernels::<bf16>::load(&gpu)?.launch(&gpu, EpilogueKind::Residual, &maps, &x, &mut c, (m, n, k))?;
//! # Ok(()) }
//! ```

use crate::gemm::{gelu, Bias, BiasGelu, Epilogue, Plain, Residual, Scale};
use clusterfuse::arch;
use clusterfuse::prelude::*;
use clusterfuse::tma::{Pipeline, PipelineState, TensorMap};
use clusterfuse::warpgroup::{AccM64N256, AccM64N64, Operand, Warpgroup, WgmmaInput};

/// Rows of C per block.
pub const BM: usize = 128;
/// Columns of C per block.
pub const BN: usize = 256;
/// K per pipeline stage: one 128-byte swizzled row of bf16.
pub const BK: usize = 64;
/// Pipeline stages in shared memory.
pub const STAGES: usize = 4;
/// Threads per block: a producer warpgroup and two consumers.
pub const THREADS: usize = 384;
/// Consumer warpgroups, each 64 rows of the tile.
const CONSUMERS: u32 = 2;
/// Bytes of one stage of A and of Bᵀ.
const A_STAGE_BYTES: u32 = (BM * BK * 2) as u32;
const B_STAGE_BYTES: u32 = (BN * BK * 2) as u32;
/// Dynamic shared memory per block: the stages, their mbarriers, and 1024 bytes to align the
/// tiles for the swizzle (197 696 bytes: one block per SM).
pub const SMEM_BYTES: u32 = 1024 + STAGES as u32 * (A_STAGE_BYTES + B_STAGE_BYTES) + 16 * STAGES as u32;
/// Registers per thread of the producer and of the consumers (40 · 128 + 232 · 256 = 64 512
/// of the SM's 65 536).
const PRODUCER_REGISTERS: u32 = 40;
const CONSUMER_REGISTERS: u32 = 232;

/// A consumer warpgroup's main loop over `k_steps` (at least one) stages of `pipeline` from
/// `state`: for each, waits for its loads, then after a fence issues its wgmmas as
/// `mma(stage, kk, accumulate)` for `kk` in `0 .. KK` (16 columns of K each; `accumulate` false for the first of
/// all, which overwrites the accumulators), commits them, and releases the stage before once
/// only the newest group may still run (`wait::<1>`), so that one stage's wgmmas overlap the
/// next one's wait. Returns, with every wgmma done, the last stage, still held, and the state
/// after it. `mma` may read the stage's tiles: they stay loaded until released. The loop runs
/// at least once: a path that skipped it would set the accumulators outside `wgmma` before
/// the final wait, and ptxas would then serialise every `wgmma`.
#[inline(always)]
pub(crate) fn consume<const S: usize, const KK: u32>(
    wg: &Warpgroup,
    pipeline: &Pipeline<S>,
    mut state: PipelineState<S>,
    k_steps: usize,
    mut mma: impl FnMut(u32, u32, bool),
) -> (PipelineState<S>, PipelineState<S>) {
    let mut previous: Option<PipelineState<S>> = None;
    let mut kt = 0;
    loop {
        pipeline.consumer_wait(state);
        wg.fence();
        for kk in 0..KK {
            mma(state.stage() as u32, kk, kt > 0 || kk > 0);
        }
        wg.commit();
        wg.wait::<1>();
        if let (Some(done), 0) = (previous, wg.thread_rank()) {
            pipeline.consumer_release(done);
        }
        previous = Some(state);
        state = state.next();
        kt += 1;
        if kt == k_steps {
            break;
        }
    }
    wg.wait::<0>();
    (previous.unwrap_or(state), state)
}

/// The block's 128 × 256 tile of `out = epilogue(a · bᵀ)` from the tensor maps of A and Bᵀ:
/// the body of every kernel. Traps unless K is a positive multiple of 8 and `out` holds M × N.
#[inline(always)]
pub fn gemm<T: WgmmaInput + HalfFloat, E: TileEpilogue>(a_map: &[u64], b_map: &[u64], out: &Out<T>, m: u32, n: u32, k: u32, epilogue: E) {
    const { assert!(THREADS as u32 == (1 + CONSUMERS) * 128 && BM == 64 * CONSUMERS as usize && BK * 2 == 128) };
    let (m, n, k) = (m as usize, n as usize, k as usize);
    if out.len() < m * n || k == 0 || !k.is_multiple_of(8) {
        arch::trap()
    }
    let (a_map, b_map) = (TensorMap::new(a_map), TensorMap::new(b_map));
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let a_tiles = smem.take::<T>(STAGES * BM * BK).addr();
    let b_tiles = smem.take::<T>(STAGES * BN * BK).addr();
    // SAFETY: fresh shared memory, and the block barrier right after.
    let pipeline = unsafe { Pipeline::<STAGES>::new(smem.take::<u64>(2 * STAGES), CONSUMERS) };
    block::sync();
    // Launched programmatically, the kernel reads A and the residual, and writes C, only once
    // the previous kernel has completed; the next may start once every block is here.
    grid::wait_for_prerequisites();
    grid::launch_dependents();

    let wg = Warpgroup::current();
    // Persistent: block b computes tiles b, b + grid, b + 2·grid, … (row-major over the tiles
    // of C), so that a block's epilogue overlaps the producer's loads for its next tile.
    // Tile numbers in 32 bits (M · N < 2^32), sparing registers in the consumers' loop.
    let (tiles_n, k_steps) = (n.div_ceil(BN) as u32, k.div_ceil(BK));
    let (tiles, first, grid) = (m.div_ceil(BM) as u32 * tiles_n, block::index_x(), arch::nctaid_x());
    let origin = |tile: u32| ((tile / tiles_n) as usize * BM, (tile % tiles_n) as usize * BN);
    if wg.index() == 0 {
        wg.lower_registers::<PRODUCER_REGISTERS>();
        if wg.thread_rank() == 0 {
            let (mut state, mut tile) = (PipelineState::START, first);
            while tile < tiles {
                let (bm, bn) = origin(tile);
                for kt in 0..k_steps {
                    let full = pipeline.producer_acquire(state, A_STAGE_BYTES + B_STAGE_BYTES);
                    let s = state.stage() as u32;
                    // SAFETY: the stage's tiles are 1024-aligned and sized for the boxes, and
                    // free (its empty barrier passed); the full barrier expects both boxes' bytes.
                    unsafe {
                        a_map.load_2d(a_tiles + s * A_STAGE_BYTES, (kt * BK) as i32, bm as i32, full);
                        b_map.load_2d(b_tiles + s * B_STAGE_BYTES, (kt * BK) as i32, bn as i32, full);
                    }
                    state = state.next();
                }
                tile += grid;
            }
        }
        return;
    }
    wg.raise_registers::<CONSUMER_REGISTERS>();
    // This warpgroup's 64 rows of the tile.
    let rows = 64 * (wg.index() as usize - 1);
    let mut acc = AccM64N256::ZERO;
    let mut state = PipelineState::<STAGES>::START;
    // Neighbouring columns in one 4-byte store where N (so every row) keeps them aligned.
    let (t, paired) = (wg.thread_rank(), n.is_multiple_of(2) && (out.as_mut_ptr() as usize).is_multiple_of(4));
    let mut tile = first;
    while tile < tiles {
        let (bm, bn) = origin(tile);
        // The epilogue's operands of a whole tile, read now so that they arrive during the
        // main loop: one check per tile, then unchecked loads (`None` at C's edges).
        let operands = if paired { epilogue.fetch(t, bm + rows, bn, m, n) } else { None };
        let (last, next) = consume::<STAGES, { (BK / 16) as u32 }>(&wg, &pipeline, state, k_steps, |s, kk, accumulate| {
            let a = Operand::<T>::k_major_swizzle_128b(a_tiles + s * A_STAGE_BYTES, 16 * kk).rows_down(rows as u32);
            let b = Operand::<T>::k_major_swizzle_128b(b_tiles + s * B_STAGE_BYTES, 16 * kk);
            // SAFETY: `consume`'s guarantees: the stage is loaded and stays so, the whole
            // warpgroup runs this after a fence. The tile's first wgmma overwrites `acc`.
            unsafe { wg.mma_m64n256k16(a, b, &mut acc, accumulate) };
        });
        if wg.thread_rank() == 0 {
            pipeline.consumer_release(last);
        }
        state = next;
        // Unrolled, so that `acc` and the operands are only indexed by constants and stay in
        // registers.
        if let Some(operands) = &operands {
            let (r, c) = AccM64N256::position(t, 0);
            let first = (bm + rows + r) * n + bn + c;
            // Four chunks of 16 pairs: each chunk's operands are read together (their loads
            // overlap), then applied and stored.
            unroll!(q in [0 1 2 3] {
                let chunk = epilogue.chunk(operands, q);
                unroll!(i in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15] {
                    let p = 16 * q + i;
                    let [x, y] = epilogue.apply_pair(operands, &chunk, p, [acc.values[2 * p], acc.values[2 * p + 1]]);
                    // SAFETY: the tile lies inside C (`fetch` returned operands), which `out`
                    // holds (checked on entry); pair p sits 8 (p % 2) rows and 8 (p / 2)
                    // columns from the thread's first value, at an even column; N even and
                    // `out` 4-byte aligned (`paired`) keep it aligned.
                    unsafe { out.store_pair_unchecked(first + 8 * (p % 2) * n + 8 * (p / 2), T::pair_from_f32(x, y)) };
                });
            });
        } else {
            unroll!(p in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63] {
                let (r, c) = AccM64N256::position(t, 2 * p);
                let (row, col) = (bm + rows + r, bn + c);
                let value = |i: usize, col: usize| T::from_f32(epilogue.apply(acc.values[i], row, col, n));
                if row < m && col + 1 < n && paired {
                    out.store_pair(row * n + col, [value(2 * p, col), value(2 * p + 1, col + 1)]);
                } else if row < m {
                    if col < n {
                        out.set(row * n + col, value(2 * p, col));
                    }
                    if col + 1 < n {
                        out.set(row * n + col + 1, value(2 * p + 1, col + 1));
                    }
                }
            });
        }
        tile += grid;
    }
}

/// An [`Epilogue`] as the kernels apply it to a whole tile: its operands for one thread's
/// values, read in 4-byte pairs before the tile's main loop so that their latency hides
/// behind it, then applied to pairs of accumulators. Tiles at C's edges take
/// [`Epilogue::apply`], value by value.
pub trait TileEpilogue: Epilogue {
    /// Warpgroup thread `t`'s operands of a 64 × 256 block.
    type Operands: Copy;

    /// Thread `t`'s operands of the 64 × 256 block at (`row`, `col`) of an M × N C, or `None`
    /// unless the block lies inside C and the operands are 4-byte aligned.
    fn fetch(&self, t: u32, row: usize, col: usize, m: usize, n: usize) -> Option<Self::Operands>;

    /// Operands read in the epilogue, for accumulator pairs `16 q .. 16 q + 16`.
    type Chunk: Copy;

    /// The operands of chunk `q` (< 4), read together before any of the chunk's stores.
    fn chunk(&self, operands: &Self::Operands, q: usize) -> Self::Chunk;

    /// The outputs of the thread's accumulators `2 p` and `2 p + 1` (`p` < 64, in chunk
    /// `p / 16`).
    fn apply_pair(&self, operands: &Self::Operands, chunk: &Self::Chunk, p: usize, acc: [f32; 2]) -> [f32; 2];
}

/// Whether the 64 × 256 block at (`row`, `col`) lies inside an M × N matrix.
#[inline(always)]
fn inside(row: usize, col: usize, m: usize, n: usize) -> bool {
    row + 64 <= m && col + BN <= n
}

/// Whether `values` holds `len` elements from a 4-byte-aligned start, with rows of an even `n`.
#[inline(always)]
fn pairs<T>(values: &[T], len: usize, n: usize) -> bool {
    values.len() >= len && n.is_multiple_of(2) && (values.as_ptr() as usize).is_multiple_of(4)
}

/// Thread `t`'s 32 column pairs of a `bias` row from column `col` (accumulator pair `p`
/// holds columns of pair `p / 2`).
///
/// # Safety
/// 1. `col + 256 <= bias.len()` and `bias[col]` is 4-byte aligned, `col` even.
#[inline(always)]
unsafe fn bias_pairs<T: Copy>(bias: &[T], t: u32, col: usize) -> [u32; 32] {
    core::array::from_fn(|j| {
        let c = col + AccM64N256::position(t, 4 * j).1;
        // SAFETY: c + 2 <= col + 256 (invariant 1); c is even, so aligned. Kept packed
        // (32 registers, not 64) through the main loop.
        unsafe { core::mem::transmute_copy(&global::load_pair_unchecked(bias, c)) }
    })
}

/// The pair of `T` packed in `bits` by [`bias_pairs`], widened.
#[inline(always)]
fn unpack<T: HalfFloat>(bits: u32) -> [f32; 2] {
    // SAFETY: `bits` holds two 2-byte `T` (`load_pair_unchecked`'s result).
    unsafe { core::mem::transmute_copy::<u32, [T; 2]>(&bits) }.map(T::to_f32)
}

impl TileEpilogue for Plain {
    type Operands = ();
    type Chunk = ();

    #[inline(always)]
    fn fetch(&self, _: u32, row: usize, col: usize, m: usize, n: usize) -> Option<()> {
        inside(row, col, m, n).then_some(())
    }

    #[inline(always)]
    fn chunk(&self, _: &(), _: usize) {}

    #[inline(always)]
    fn apply_pair(&self, _: &(), _: &(), _: usize, acc: [f32; 2]) -> [f32; 2] {
        acc
    }
}

impl TileEpilogue for Scale {
    type Operands = ();
    type Chunk = ();

    #[inline(always)]
    fn fetch(&self, _: u32, row: usize, col: usize, m: usize, n: usize) -> Option<()> {
        inside(row, col, m, n).then_some(())
    }

    #[inline(always)]
    fn chunk(&self, _: &(), _: usize) {}

    #[inline(always)]
    fn apply_pair(&self, _: &(), _: &(), _: usize, acc: [f32; 2]) -> [f32; 2] {
        acc.map(|a| self.0 * a)
    }
}

impl<T: HalfFloat> TileEpilogue for Bias<'_, T> {
    type Operands = [u32; 32];
    type Chunk = ();

    #[inline(always)]
    fn fetch(&self, t: u32, row: usize, col: usize, m: usize, n: usize) -> Option<Self::Operands> {
        // SAFETY: col + 256 <= n <= bias.len(), the bias aligned and `col` a multiple of 256.
        (inside(row, col, m, n) && pairs(self.0, n, n)).then(|| unsafe { bias_pairs(self.0, t, col) })
    }

    #[inline(always)]
    fn chunk(&self, _: &Self::Operands, _: usize) {}

    #[inline(always)]
    fn apply_pair(&self, bias: &Self::Operands, _: &(), p: usize, acc: [f32; 2]) -> [f32; 2] {
        let b = unpack::<T>(bias[p / 2]);
        [acc[0] + b[0], acc[1] + b[1]]
    }
}

impl<T: HalfFloat> TileEpilogue for BiasGelu<'_, T> {
    type Operands = [u32; 32];
    type Chunk = ();

    #[inline(always)]
    fn fetch(&self, t: u32, row: usize, col: usize, m: usize, n: usize) -> Option<Self::Operands> {
        Bias(self.0).fetch(t, row, col, m, n)
    }

    #[inline(always)]
    fn chunk(&self, _: &Self::Operands, _: usize) {}

    #[inline(always)]
    fn apply_pair(&self, bias: &Self::Operands, chunk: &(), p: usize, acc: [f32; 2]) -> [f32; 2] {
        Bias(self.0).apply_pair(bias, chunk, p, acc).map(gelu)
    }
}

impl<T: HalfFloat> TileEpilogue for Residual<'_, T> {
    /// The index of the thread's first value, and N: the values are read in the epilogue
    /// (held through the main loop they would spill), a chunk at a time.
    type Operands = (usize, usize);
    type Chunk = [[T; 2]; 16];

    #[inline(always)]
    fn fetch(&self, t: u32, row: usize, col: usize, m: usize, n: usize) -> Option<Self::Operands> {
        let (r, c) = AccM64N256::position(t, 0);
        (inside(row, col, m, n) && pairs(self.0, m * n, n)).then_some(((row + r) * n + col + c, n))
    }

    #[inline(always)]
    fn chunk(&self, &(first, n): &Self::Operands, q: usize) -> Self::Chunk {
        core::array::from_fn(|i| {
            // Pair p sits 8 (p % 2) rows and 8 (p / 2) columns from the thread's first.
            let p = 16 * q + i;
            // SAFETY: the pair lies inside the M × N residual (`fetch` checked the block),
            // 4-byte aligned (N even, the start aligned, `first` even).
            unsafe { global::load_pair_unchecked(self.0, first + 8 * (p % 2) * n + 8 * (p / 2)) }
        })
    }

    #[inline(always)]
    fn apply_pair(&self, _: &Self::Operands, residual: &Self::Chunk, p: usize, acc: [f32; 2]) -> [f32; 2] {
        let r = residual[p % 16];
        [acc[0] + r[0].to_f32(), acc[1] + r[1].to_f32()]
    }
}

/// Columns of C per block of the split-K kernels ([`gemm_split_k`]).
pub const SPLIT_BN: usize = 64;
/// The most blocks a split-K cluster splits K over: the portable cluster size, which
/// [`split_k_config`] keeps to and [`split_k_sum_rows`] holds a row's vectors of in registers.
pub const MAX_SPLITS: usize = 8;
/// The most pipeline stages of a split-K block: every k-step of BERT-base's batch-1
/// projections (at most 6 a block) in flight at once.
const SPLIT_STAGES: usize = 6;
/// The fewest stages a split-K block lays out: the f32 partial tile takes their place.
const MIN_SPLIT_STAGES: usize = 2;
/// Bytes of one stage of Bᵀ of the split-K kernels.
const SPLIT_B_STAGE_BYTES: u32 = (SPLIT_BN * BK * 2) as u32;
/// Row stride, in 4-byte words, of a split-K block's partial tile: 8 words of padding, so that
/// a warp's f32 accumulator stores (8 rows × 4 column pairs) hit each bank at most twice.
const PARTIAL_STRIDE: usize = SPLIT_BN + 8;

/// The element of a split-K block's partial tile as it crosses the cluster: `f32`, or `f16`
/// for half the DSMEM bytes of [`split_k_sum_rows`] (bounded by them: `results/bert-h200.md`),
/// each block's partial sum rounded once (a reduced-precision split-K reduction, which PyTorch
/// allows cuBLAS by default for f16 GEMMs); the sum over the blocks stays f32. A partial past
/// f16's range (65 504) becomes ±∞ even where the whole sum would not: for products whose
/// output, f16 too, is of the partials' order. Rows of [`PARTIAL_STRIDE`] words either way.
pub trait Partial: Copy {
    /// A lane's four consecutive columns of a row: one DSMEM load.
    type Quad: arch::SharedWord + Copy + Default;
    /// Quads a row of the tile: [`PARTIAL_STRIDE`] words.
    const ROW_QUADS: usize;
    /// Stores accumulators `pair` of columns `col` (even) and `col + 1` of row `row`.
    fn store_pair(words: SharedSlice<u32>, row: usize, col: usize, pair: [f32; 2]);
    /// The four values of a quad.
    fn unpack(quad: Self::Quad) -> [f32; 4];
}

impl Partial for f32 {
    type Quad = [u32; 4];
    const ROW_QUADS: usize = PARTIAL_STRIDE / 4;
    #[inline(always)]
    fn store_pair(words: SharedSlice<u32>, row: usize, col: usize, pair: [f32; 2]) {
        words.store(row * PARTIAL_STRIDE + col, pair[0].to_bits());
        words.store(row * PARTIAL_STRIDE + col + 1, pair[1].to_bits());
    }
    #[inline(always)]
    fn unpack(quad: [u32; 4]) -> [f32; 4] {
        quad.map(f32::from_bits)
    }
}

impl Partial for f16 {
    type Quad = u64;
    const ROW_QUADS: usize = PARTIAL_STRIDE / 2;
    #[inline(always)]
    fn store_pair(words: SharedSlice<u32>, row: usize, col: usize, pair: [f32; 2]) {
        words.store(row * PARTIAL_STRIDE + col / 2, arch::cvt_rn_f16x2_f32(pair[1], pair[0]));
    }
    #[inline(always)]
    fn unpack(quad: u64) -> [f32; 4] {
        core::array::from_fn(|i| f16::from_bits((quad >> (16 * i)) as u16).to_f32())
    }
}

/// Stages a split-K block of `steps` k-steps lays out: one a k-step, between
/// [`MIN_SPLIT_STAGES`] and [`SPLIT_STAGES`] (beyond, the pipeline goes round).
const fn split_stages(steps: usize) -> usize {
    if steps < MIN_SPLIT_STAGES {
        MIN_SPLIT_STAGES
    } else if steps > SPLIT_STAGES {
        SPLIT_STAGES
    } else {
        steps
    }
}

/// Dynamic shared memory of a split-K block of at most `steps` k-steps: its stages, the
/// mbarriers of [`SPLIT_STAGES`], and 1024 bytes to align the tiles for the swizzle (at most
/// 148 576 bytes). The f32 partial tile (36 864 bytes) takes the drained stages' place. Less
/// than the most leaves room on the SM for a block of the kernel after it, launched
/// programmatically, whose prologue then overlaps this kernel (BERT's attention,
/// `results/bert-h200.md`).
pub const fn split_smem_bytes(steps: usize) -> u32 {
    1024 + split_stages(steps) as u32 * (A_STAGE_BYTES + SPLIT_B_STAGE_BYTES) + 16 * SPLIT_STAGES as u32
}

/// The block's share of the 128 × 64 tile of `out = epilogue(a · bᵀ)` at (block y, block x),
/// for small M: the blocks of a cluster along z split K's steps between them, as example
/// 10's do, and sum their partial tiles over DSMEM in rank order
/// (`cluster::reduce_scatter`, deterministic), each applying the epilogue to and storing its
/// share. Same threads and roles as [`gemm`] (a producer warpgroup issuing TMA loads, two
/// consumer warpgroups of 64 rows, here `wgmma.m64n64k16`), but one tile a block and no
/// `setmaxnreg` (32 accumulators a thread). The producer loads the first stages' Bᵀ (the
/// weights) before waiting for the kernel it may be launched programmatically after. Traps
/// unless K is a positive multiple of 8, `out` holds M × N and every block has a k-step.
#[inline(always)]
pub fn gemm_split_k<T: WgmmaInput + HalfFloat, E: Epilogue>(a_map: &[u64], b_map: &[u64], out: &Out<T>, m: u32, n: u32, k: u32, epilogue: E) {
    let (m, n) = (m as usize, n as usize);
    if out.len() < m * n {
        arch::trap()
    }
    let words = split_k_partial::<T, f32>(a_map, b_map, k as usize);
    // SAFETY: the same words, which `split_k_partial::<_, f32>` wrote as f32.
    let partial = unsafe { SharedSlice::<f32>::from_raw_parts(words.addr(), words.len()) };
    let (bm, bn) = split_k_origin();
    cluster::reduce_scatter(partial, Sum, |e, value| {
        let (row, col) = (bm + e / PARTIAL_STRIDE, bn + e % PARTIAL_STRIDE);
        if e % PARTIAL_STRIDE < SPLIT_BN && row < m && col < n {
            out.set(row * n + col, T::from_f32(epilogue.apply(value, row, col, n)));
        }
    });
}

/// The origin (row, column) in C of the block's split-K tile.
#[inline(always)]
fn split_k_origin() -> (usize, usize) {
    (block::index().y as usize * BM, block::index_x() as usize * SPLIT_BN)
}

/// The main loop of [`gemm_split_k`]: the block's k-steps of its tile, left as a partial tile
/// of `P` (`BM` rows of [`PARTIAL_STRIDE`] words) in the drained stages, which it returns after
/// a block barrier.
#[inline(always)]
fn split_k_partial<T: WgmmaInput + HalfFloat, P: Partial>(a_map: &[u64], b_map: &[u64], k: usize) -> SharedSlice<u32> {
    const { assert!(THREADS as u32 == (1 + CONSUMERS) * 128 && BM * PARTIAL_STRIDE * 4 <= MIN_SPLIT_STAGES * (BM + SPLIT_BN) * BK * 2) };
    let (splits, split) = (cluster::size() as usize, cluster::block_rank() as usize);
    let all_steps = k.div_ceil(BK);
    let (first, steps) = (all_steps * split / splits, all_steps * (split + 1) / splits - all_steps * split / splits);
    if k == 0 || !k.is_multiple_of(8) || steps == 0 {
        arch::trap()
    }
    let (a_map, b_map) = (TensorMap::new(a_map), TensorMap::new(b_map));
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let stages = split_stages(steps);
    let tiles = smem.take::<T>(stages * (BM + SPLIT_BN) * BK);
    let (a_tiles, b_tiles) = (tiles.addr(), tiles.addr() + stages as u32 * A_STAGE_BYTES);
    // SAFETY: fresh shared memory, and the block barrier right after.
    let pipeline = unsafe { Pipeline::<SPLIT_STAGES>::new(smem.take::<u64>(2 * SPLIT_STAGES), CONSUMERS) };
    block::sync();
    let (bm, bn) = split_k_origin();
    let wg = Warpgroup::current();
    let mut acc = AccM64N64::ZERO;
    // This warpgroup's 64 rows of the tile (consumers).
    let rows = 64 * (wg.index().max(1) as usize - 1);
    if wg.index() == 0 {
        if wg.thread_rank() == 0 {
            let bytes = A_STAGE_BYTES + SPLIT_B_STAGE_BYTES;
            let ahead = steps.min(stages);
            let mut state = PipelineState::START;
            for kt in 0..ahead {
                let full = pipeline.producer_acquire(state, bytes);
                // SAFETY: the stage's tile is 1024-aligned and sized for the box, and free
                // (first time round); the full barrier expects both boxes' bytes.
                unsafe { b_map.load_2d(b_tiles + kt as u32 * SPLIT_B_STAGE_BYTES, ((first + kt) * BK) as i32, bn as i32, full) };
                state = state.next();
            }
            // A (activations) only once the previous kernel has completed.
            grid::wait_for_prerequisites();
            let mut early = PipelineState::<SPLIT_STAGES>::START;
            for kt in 0..ahead {
                // SAFETY: as above; this stage's full barrier already counts A's bytes.
                unsafe { a_map.load_2d(a_tiles + kt as u32 * A_STAGE_BYTES, ((first + kt) * BK) as i32, bm as i32, pipeline.full(early)) };
                early = early.next();
            }
            for kt in ahead..steps {
                let full = pipeline.producer_acquire(state, bytes);
                let s = state.stage() as u32;
                // SAFETY: as above (the stage's empty barrier passed).
                unsafe {
                    a_map.load_2d(a_tiles + s * A_STAGE_BYTES, ((first + kt) * BK) as i32, bm as i32, full);
                    b_map.load_2d(b_tiles + s * SPLIT_B_STAGE_BYTES, ((first + kt) * BK) as i32, bn as i32, full);
                }
                state = state.next();
            }
        }
        // The epilogue reads the residual, which the previous kernel may write.
        grid::wait_for_prerequisites();
        grid::launch_dependents();
    } else {
        grid::wait_for_prerequisites();
        grid::launch_dependents();
        // The last stage stays held: the partial tile takes the stages' place below.
        consume::<SPLIT_STAGES, { (BK / 16) as u32 }>(&wg, &pipeline, PipelineState::<SPLIT_STAGES>::START, steps, |s, kk, accumulate| {
            let a = Operand::<T>::k_major_swizzle_128b(a_tiles + s * A_STAGE_BYTES, 16 * kk).rows_down(rows as u32);
            let b = Operand::<T>::k_major_swizzle_128b(b_tiles + s * SPLIT_B_STAGE_BYTES, 16 * kk);
            // SAFETY: as in `gemm`.
            unsafe { wg.mma_m64n64k16(a, b, &mut acc, accumulate) };
        });
    }
    // Every load has landed and every wgmma has read its operands: the partial tile may take
    // the stages' place.
    block::sync();
    // SAFETY: the first BM × PARTIAL_STRIDE words of the stages (fewer bytes, checked above),
    // 1024-aligned; nothing reads the stages any more.
    let partial = unsafe { SharedSlice::<u32>::from_raw_parts(a_tiles, BM * PARTIAL_STRIDE) };
    if wg.index() > 0 {
        let t = wg.thread_rank();
        // Unrolled, so that `acc` is only indexed by constants and stays in registers.
        unroll!(i in [0 2 4 6 8 10 12 14 16 18 20 22 24 26 28 30] {
            let (r, c) = AccM64N256::position(t, i);
            P::store_pair(partial, rows + r, c, [acc.values[i], acc.values[i + 1]]);
        });
    }
    partial
}

/// The widest row a [`RowNorm`] normalises: 32 tiles of 64 columns, whose statistics a
/// half-warp reads, two tiles a lane.
pub const NORM_MAX_N: usize = 32 * SPLIT_BN;

/// `LayerNorm(x) · γ + β` of the rows of an M × N tensor x (N a multiple of 128, at most
/// [`NORM_MAX_N`]), from the statistics of its 64-column tiles that [`split_k_sum_rows`]
/// writes with it: `stats[2 (row · N/64 + j)]` and the word after hold the mean and
/// Σ(v − mean)² of row `row`'s 64 values in tile `j`. The tiles' statistics merge in order
/// (Chan et al.), so every reader gets the same mean and 1/σ of a row, and those that
/// materialise the LayerNorm ([`BiasNormalizedResidual`], [`fn@layer_norm_rows`]) the same f16
/// values ([`RowNorm::apply`]).
#[derive(Clone, Copy)]
pub struct RowNorm<'a> {
    pub stats: &'a [f32],
    pub gamma: &'a [f16],
    pub beta: &'a [f16],
}

impl RowNorm<'_> {
    /// Row `row`'s mean and 1/√(σ² + ε) ([`row_stats`]).
    #[inline(always)]
    pub fn row(&self, row: usize) -> (f32, f32) {
        row_stats(self.stats, row, self.gamma.len())
    }

    /// Value `x` of a row with `stats`, of a column with (γ, β), normalised, scaled and
    /// shifted, rounded to f16 (as a framework's fp16 LayerNorm writes it).
    #[inline(always)]
    fn apply(x: f32, (mean, rstd): (f32, f32), gamma: f32, beta: f32) -> f16 {
        f16::from_f32(((x - mean) * rstd).fma(gamma, beta))
    }
}

/// The mean and 1/√(σ² + ε) (σ² the biased variance, as LayerNorm takes it) of row `row` of an
/// M × `n` tensor from its tiles' statistics ([`RowNorm`]), merged over a half-warp: every
/// lane of the warp calls it, each half-warp for a row of its own, and lane `l` reads tiles
/// `2l` and `2l + 1` (one 16-byte vector).
#[inline(always)]
pub fn row_stats(stats: &[f32], row: usize, n: usize) -> (f32, f32) {
    merge_row_stats(load_row_stats(stats, row, n), n)
}

/// The calling lane's share of [`row_stats`]' loads: one load, issued ahead of the merge.
#[inline(always)]
fn load_row_stats(stats: &[f32], row: usize, n: usize) -> [f32; 4] {
    let (tiles, lane) = (n / SPLIT_BN, warp::lane() as usize % 16);
    if !n.is_multiple_of(2 * SPLIT_BN) || n > NORM_MAX_N {
        arch::trap()
    }
    if lane < tiles / 2 { global::load16::<f32, 4>(stats, row * tiles / 2 + lane) } else { [0.0; 4] }
}

/// [`row_stats`] from the half-warp's loads ([`load_row_stats`]).
#[inline(always)]
fn merge_row_stats(v: [f32; 4], n: usize) -> (f32, f32) {
    let (tiles, lane) = (n / SPLIT_BN, warp::lane() as usize % 16);
    let mean = warp::group_sum::<16, f32>(v[0] + v[2]) / tiles as f32;
    let (d0, d1) = (v[0] - mean, v[2] - mean);
    let squares = if lane < tiles / 2 { (SPLIT_BN as f32 * d0).fma(d0, (SPLIT_BN as f32 * d1).fma(d1, v[1] + v[3])) } else { 0.0 };
    (mean, math::rsqrt(warp::group_sum::<16, f32>(squares) / n as f32 + crate::norms::EPS))
}

/// An epilogue of [`split_k_sum_rows`], applied to a lane's four columns of a row at a time.
/// Its global loads are split from its arithmetic, so that they are in flight while the
/// cluster's partial sums are read over DSMEM: what the lane's columns need is loaded once
/// (`columns`), what a row needs a row ahead (`load`).
pub trait RowEpilogue: Copy {
    /// The partial tiles' element ([`Partial`]): `f16` unless the epilogue cancels a large
    /// share of the sum, which a rounded partial would leave as error.
    type Partial: Partial;
    /// What columns `col .. col + 4` need, as loaded.
    type Columns: Copy;
    /// What row `row` needs at those columns, as loaded.
    type Loaded: Copy;
    /// The loads of columns `col .. col + 4`.
    fn columns(&self, col: usize) -> Self::Columns;
    /// The loads of row `row` of an `n`-column C at columns `col .. col + 4`.
    fn load(&self, row: usize, col: usize, n: usize) -> Self::Loaded;
    /// The outputs at a row's columns `col .. col + 4` from their accumulators; every lane of
    /// the warp calls it, each half-warp for a row of its own (it may shuffle).
    fn apply(&self, columns: &Self::Columns, loaded: Self::Loaded, acc: [f32; 4]) -> [f32; 4];
}

/// `C = A·Bᵀ + bias[col] + R` for an M × N residual R.
#[derive(Clone, Copy)]
pub struct BiasResidual<'a>(pub &'a [f16], pub &'a [f16]);

impl RowEpilogue for BiasResidual<'_> {
    type Partial = f16;
    type Columns = [f16; 4];
    type Loaded = [f16; 4];
    #[inline(always)]
    fn columns(&self, col: usize) -> [f16; 4] {
        global::load_quad(self.0, col)
    }
    #[inline(always)]
    fn load(&self, row: usize, col: usize, n: usize) -> [f16; 4] {
        global::load_quad(self.1, row * n + col)
    }
    #[inline(always)]
    fn apply(&self, bias: &[f16; 4], residual: [f16; 4], acc: [f32; 4]) -> [f32; 4] {
        core::array::from_fn(|c| acc[c] + bias[c].to_f32() + residual[c].to_f32())
    }
}

/// `C = A·Bᵀ + bias[col] + LayerNorm(R)·γ + β` for an M × N R whose LayerNorm is deferred
/// to its readers ([`RowNorm`]): the residual of a post-LN layer.
#[derive(Clone, Copy)]
pub struct BiasNormalizedResidual<'a> {
    pub bias: &'a [f16],
    pub residual: &'a [f16],
    pub norm: RowNorm<'a>,
}

impl RowEpilogue for BiasNormalizedResidual<'_> {
    type Partial = f16;
    /// bias, γ and β.
    type Columns = [[f16; 4]; 3];
    /// The residual's values and the lane's share of its row's statistics.
    type Loaded = ([f16; 4], [f32; 4]);
    #[inline(always)]
    fn columns(&self, col: usize) -> [[f16; 4]; 3] {
        [global::load_quad(self.bias, col), global::load_quad(self.norm.gamma, col), global::load_quad(self.norm.beta, col)]
    }
    #[inline(always)]
    fn load(&self, row: usize, col: usize, n: usize) -> ([f16; 4], [f32; 4]) {
        (global::load_quad(self.residual, row * n + col), load_row_stats(self.norm.stats, row, n))
    }
    #[inline(always)]
    fn apply(&self, [bias, gamma, beta]: &[[f16; 4]; 3], (residual, stats): ([f16; 4], [f32; 4]), acc: [f32; 4]) -> [f32; 4] {
        let stats = merge_row_stats(stats, self.norm.gamma.len());
        core::array::from_fn(|c| acc[c] + bias[c].to_f32() + RowNorm::apply(residual[c].to_f32(), stats, gamma[c].to_f32(), beta[c].to_f32()).to_f32())
    }
}

/// `C = rstd · (A·W′ᵀ − mean · c) + d`, then GELU if `GELU`: `LayerNorm(A)·Wᵀ + bias` with
/// the LayerNorm of A (K columns, statistics from [`RowNorm`]'s `stats`) folded into the
/// product, so that the GEMM reads A as stored. The host folds γ and β into the weights:
/// `W′ = W·diag(γ)` (rounded to f16), `c[n] = Σₖ W′[n, k]`, `d = bias + W·β`
/// ([`fold_layer_norm`]). Unlike a framework, which rounds LayerNorm(A) to f16 before the
/// product, it keeps it exact; the mean's share cancels in f32, exactly where |mean| is of
/// the order of σ (activations of a post-LN layer).
#[derive(Clone, Copy)]
pub struct FoldedNorm<'a, const GELU: bool> {
    pub stats: &'a [f32],
    pub k: usize,
    pub c: &'a [f32],
    pub d: &'a [f32],
}

impl<const GELU: bool> RowEpilogue for FoldedNorm<'_, GELU> {
    /// f32: the product is of A as stored, whose mean's share `mean · c` the epilogue
    /// cancels; rounded to f16, each partial would carry an error of its order.
    type Partial = f32;
    /// c and d, a 16-byte vector each.
    type Columns = [[f32; 4]; 2];
    /// The lane's share of A's row's statistics.
    type Loaded = [f32; 4];
    #[inline(always)]
    fn columns(&self, col: usize) -> [[f32; 4]; 2] {
        [global::load16(self.c, col / 4), global::load16(self.d, col / 4)]
    }
    #[inline(always)]
    fn load(&self, row: usize, _: usize, _: usize) -> [f32; 4] {
        load_row_stats(self.stats, row, self.k)
    }
    #[inline(always)]
    fn apply(&self, [c, d]: &[[f32; 4]; 2], stats: [f32; 4], acc: [f32; 4]) -> [f32; 4] {
        let (mean, rstd) = merge_row_stats(stats, self.k);
        core::array::from_fn(|e| {
            let v = ((-mean).fma(c[e], acc[e])).fma(rstd, d[e]);
            if GELU { gelu(v) } else { v }
        })
    }
}

/// [`gemm_split_k`] with an epilogue taken a row at a time, f16, N a multiple of 64: the
/// cluster's partial tiles summed over DSMEM in rank order, the epilogue applied and the tile
/// written to `out`, and where `stats` is given, per row, the mean and Σ(v − mean)² of its 64
/// f16 values ([`RowNorm`]'s input, N/64 pairs a row): the kernels whose output a LayerNorm
/// follows leave it to the readers, so that no block waits for another cluster. Block `r` of
/// the cluster takes rows `r·⌈128/size⌉ ..`, a half-warp a row and a lane 4 columns, the
/// partial tiles of the epilogue's [`Partial`] element. Traps on a cluster of more than
/// [`MAX_SPLITS`] blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub fn gemm_split_k_rows<E: RowEpilogue>(a_map: &[u64], b_map: &[u64], out: &Out<f16>, stats: Option<&Out<f32>>, m: u32, n: u32, k: u32, epilogue: E) {
    let (m, n) = (m as usize, n as usize);
    if out.len() < m * n || !n.is_multiple_of(SPLIT_BN) || stats.is_some_and(|stats| stats.len() < 2 * m * (n / SPLIT_BN)) {
        arch::trap()
    }
    let partial = split_k_partial::<f16, E::Partial>(a_map, b_map, k as usize);
    split_k_sum_rows(partial, out, stats, split_k_origin(), m, n, epilogue);
}

/// The tail of [`gemm_split_k_rows`].
#[inline(always)]
fn split_k_sum_rows<E: RowEpilogue>(partial: SharedSlice<u32>, out: &Out<f16>, stats: Option<&Out<f32>>, (bm, bn): (usize, usize), m: usize, n: usize, epilogue: E) {
    const HALF_WARPS: usize = THREADS / 16;
    let (blocks, rank) = (cluster::size() as usize, cluster::block_rank() as usize);
    let per_block = BM.div_ceil(blocks);
    let (start, end) = ((rank * per_block).min(BM), ((rank + 1) * per_block).min(BM));
    let t = thread::rank_in_block() as usize;
    let (half, lane) = (t / 16, t % 16);
    // SAFETY: the partial tile's BM × PARTIAL_STRIDE words as quads (1024-aligned).
    let quads = unsafe { SharedSlice::<<E::Partial as Partial>::Quad>::from_raw_parts(partial.addr(), BM * E::Partial::ROW_QUADS) };
    let col = bn + 4 * lane;
    // This block's partial tile is in place. The release waits for the thread's memory
    // accesses in flight (`MEMBAR.ALL.GPU`), so the epilogue's global loads are issued after
    // it: those of the lane's first row (every lane, rows past the block's clamped) fly while
    // the cluster synchronises, each later row's during the two rows before it. The wait
    // lasts until they have landed too, so they are few and wide (`global::load_quad`).
    cluster::arrive();
    let load = |local: usize| epilogue.load((bm + local.min(end - 1)).min(m - 1), col, n);
    let (columns, mut loaded) = (epilogue.columns(col), load(start + half));
    // Every block's partial tile is in place.
    cluster::wait();
    if blocks > MAX_SPLITS {
        arch::trap()
    }
    // Every block's vector of the lane's row, all in flight at once.
    let peers = |local: usize| -> [<E::Partial as Partial>::Quad; MAX_SPLITS] {
        let v = local.min(BM - 1) * E::Partial::ROW_QUADS + lane;
        core::array::from_fn(|p| if p < blocks { quads.in_block(p as u32).load(v) } else { Default::default() })
    };
    let mut words = [Default::default(); MAX_SPLITS];
    if start < end {
        words = peers(start + half);
    } else {
        // No rows: the block reads no peer's shared memory.
        cluster::arrive_relaxed();
    }
    // Each later row's loads, two rows ahead: the second row's now, after the wait.
    let ahead = |base: usize| (base < end).then(|| load(base + half));
    let mut next = ahead(start + HALF_WARPS);
    // Whole warps step together (the shuffles below), past the block's rows if need be.
    for base in (start..end).step_by(HALF_WARPS) {
        let local = base + half;
        let row = bm + local;
        let active = local < end && row < m;
        let after = ahead(base + 2 * HALF_WARPS);
        // Σ in rank order, as `cluster::combine_vector`; then the next row's DSMEM reads fly
        // during this row's epilogue, where the block has one.
        let acc = (0..MAX_SPLITS).fold([0.0f32; 4], |sum, p| {
            let quad = E::Partial::unpack(words[p]);
            if p < blocks { core::array::from_fn(|i| sum[i] + quad[i]) } else { sum }
        });
        if base + HALF_WARPS < end {
            words = peers(local + HALF_WARPS);
        } else {
            // The block's last DSMEM reads are consumed: its peers may leave once every block
            // has arrived, which overlaps this row's epilogue.
            cluster::arrive_relaxed();
        }
        let values = epilogue.apply(&columns, loaded, acc).map(|v| if active { f16::from_f32(v) } else { f16::from_f32(0.0) });
        if let Some(next) = next {
            loaded = next;
        }
        next = after;
        if active {
            out.store_pair(row * n + col, [values[0], values[1]]);
            out.store_pair(row * n + col + 2, [values[2], values[3]]);
        }
        let Some(stats) = stats else {
            continue;
        };
        // The row's 64 values over its half-warp: mean, then Σ(v − mean)², of the f16 values.
        let mean = warp::group_sum::<16, f32>(values.iter().fold(0.0, |s, v| s + v.to_f32())) * (1.0 / SPLIT_BN as f32);
        let squares = warp::group_sum::<16, f32>(values.iter().fold(0.0, |s: f32, v| {
            let d = v.to_f32() - mean;
            d.fma(d, s)
        }));
        if active && lane == 0 {
            let at = 2 * (row * (n / SPLIT_BN) + bn / SPLIT_BN);
            stats.set(at, mean);
            stats.set(at + 1, squares);
        }
    }
    // No block leaves while a peer may still read its partial tile.
    cluster::wait();
}

/// `out = LayerNorm(summed)·γ + β` for an M × N `summed` with its [`RowNorm`] statistics:
/// a warp per row, 8 rows a block of 256 threads. Materialises a LayerNorm that the kernels
/// after [`gemm_split_k_rows`] otherwise take on the fly.
#[kernel(launch_bounds(max_threads = 256))]
pub fn layer_norm_rows(summed: &[f16], stats: &[f32], gamma: &[f16], beta: &[f16], out: Out<f16>) {
    let norm = RowNorm { stats, gamma, beta };
    let (n, lane) = (gamma.len(), warp::lane() as usize);
    let row = (block::index_x() * 8 + warp::index_in_block()) as usize;
    grid::wait_for_prerequisites();
    grid::launch_dependents();
    if out.len() != summed.len() || beta.len() != n {
        arch::trap()
    }
    if (row + 1) * n > summed.len() {
        return;
    }
    let row_stats = norm.row(row);
    for v in (lane..n / 8).step_by(32) {
        let (x, g, b) = (global::load16::<f16, 8>(summed, row * n / 8 + v), global::load16::<f16, 8>(gamma, v), global::load16::<f16, 8>(beta, v));
        out.store16(row * n / 8 + v, core::array::from_fn::<f16, 8, _>(|e| RowNorm::apply(x[e].to_f32(), row_stats, g[e].to_f32(), b[e].to_f32())));
    }
}

macro_rules! split_k_kernels {
    ($($t:ident: $plain:ident, $bias:ident, $bias_gelu:ident, $residual:ident;)*) => {$(
        #[doc = concat!("`out = a · bᵀ`, ", stringify!($t), ", for small M ([`gemm_split_k`]): grid (⌈N/64⌉, ⌈M/128⌉, splits), clusters of (1, 1, splits) ([`split_k_config`]), 384 threads, [`split_smem_bytes`] of dynamic shared memory.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $plain(a_map: &[u64], b_map: &[u64], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm_split_k(a_map, b_map, &out, m, n, k, Plain);
        }

        #[doc = concat!("`out = a · bᵀ + bias`, ", stringify!($t), "; launched as the plain split-K kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $bias(a_map: &[u64], b_map: &[u64], bias: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm_split_k(a_map, b_map, &out, m, n, k, Bias(bias));
        }

        #[doc = concat!("`out = gelu(a · bᵀ + bias)`, ", stringify!($t), "; launched as the plain split-K kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $bias_gelu(a_map: &[u64], b_map: &[u64], bias: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm_split_k(a_map, b_map, &out, m, n, k, BiasGelu(bias));
        }

        #[doc = concat!("`out = a · bᵀ + residual`, ", stringify!($t), "; launched as the plain split-K kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $residual(a_map: &[u64], b_map: &[u64], residual: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm_split_k(a_map, b_map, &out, m, n, k, Residual(residual));
        }
    )*};
}

split_k_kernels! {
    f16: wgmma_split_f16, wgmma_split_f16_bias, wgmma_split_f16_bias_gelu, wgmma_split_f16_residual;
}

// The split-K kernels of a post-LN layer whose LayerNorms are deferred to their readers: the
// kernels before a LayerNorm write its input and the statistics of its rows; the kernels
// after fold it into their product ([`FoldedNorm`]) or take it of their residual
// ([`BiasNormalizedResidual`]).

/// `out = LayerNorm(a) · wᵀ + bias`, f16, from `b_map` of W′ and `c`, `d` ([`FoldedNorm`]),
/// A's statistics `a_stats` (K a multiple of 128); launched as the plain split-K kernel.
#[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn wgmma_split_f16_folded_ln_bias(a_map: &[u64], b_map: &[u64], a_stats: &[f32], c: &[f32], d: &[f32], out: Out<f16>, m: u32, n: u32, k: u32) {
    let epilogue = FoldedNorm::<false> { stats: a_stats, k: k as usize, c, d };
    gemm_split_k_rows(a_map, b_map, &out, None, m, n, k, epilogue);
}

/// `out = gelu(LayerNorm(a) · wᵀ + bias)`, f16, as [`fn@wgmma_split_f16_folded_ln_bias`].
#[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn wgmma_split_f16_folded_ln_bias_gelu(a_map: &[u64], b_map: &[u64], a_stats: &[f32], c: &[f32], d: &[f32], out: Out<f16>, m: u32, n: u32, k: u32) {
    let epilogue = FoldedNorm::<true> { stats: a_stats, k: k as usize, c, d };
    gemm_split_k_rows(a_map, b_map, &out, None, m, n, k, epilogue);
}

/// `out = a · bᵀ + bias + residual` and its rows' statistics, f16 (N a multiple of 64), for a
/// LayerNorm that its readers take ([`gemm_split_k_rows`]); launched as the plain split-K
/// kernel.
#[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn wgmma_split_f16_residual_stats(a_map: &[u64], b_map: &[u64], bias: &[f16], residual: &[f16], out: Out<f16>, stats: Out<f32>, m: u32, n: u32, k: u32) {
    gemm_split_k_rows(a_map, b_map, &out, Some(&stats), m, n, k, BiasResidual(bias, residual));
}

/// As [`fn@wgmma_split_f16_residual_stats`], the residual `LayerNorm(residual) · γ + β` from
/// `residual_stats`: a post-LN layer's output projection or second FFN projection.
#[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn wgmma_split_f16_ln_residual_stats(
    a_map: &[u64],
    b_map: &[u64],
    bias: &[f16],
    residual: &[f16],
    residual_stats: &[f32],
    gamma: &[f16],
    beta: &[f16],
    out: Out<f16>,
    stats: Out<f32>,
    m: u32,
    n: u32,
    k: u32,
) {
    let norm = RowNorm { stats: residual_stats, gamma, beta };
    gemm_split_k_rows(a_map, b_map, &out, Some(&stats), m, n, k, BiasNormalizedResidual { bias, residual, norm });
}

macro_rules! wgmma_kernels {
    ($($t:ident: $plain:ident, $bias:ident, $bias_gelu:ident, $residual:ident, $scale:ident;)*) => {$(
        #[doc = concat!("`out = a · bᵀ`, ", stringify!($t), ", from the tensor maps of A and Bᵀ; at most one block per SM, each looping over 128 × 256 tiles of C ([`config`]), 384 threads, [`SMEM_BYTES`] of dynamic shared memory.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $plain(a_map: &[u64], b_map: &[u64], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a_map, b_map, &out, m, n, k, Plain);
        }

        #[doc = concat!("`out = a · bᵀ + bias`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $bias(a_map: &[u64], b_map: &[u64], bias: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a_map, b_map, &out, m, n, k, Bias(bias));
        }

        #[doc = concat!("`out = gelu(a · bᵀ + bias)`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $bias_gelu(a_map: &[u64], b_map: &[u64], bias: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a_map, b_map, &out, m, n, k, BiasGelu(bias));
        }

        #[doc = concat!("`out = a · bᵀ + residual`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $residual(a_map: &[u64], b_map: &[u64], residual: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a_map, b_map, &out, m, n, k, Residual(residual));
        }

        #[doc = concat!("`out = alpha · a · bᵀ`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 384, min_blocks = 1))]
        pub fn $scale(a_map: &[u64], b_map: &[u64], out: Out<$t>, alpha: f32, m: u32, n: u32, k: u32) {
            gemm(a_map, b_map, &out, m, n, k, Scale(alpha));
        }
    )*};
}

wgmma_kernels! {
    bf16: wgmma_bf16, wgmma_bf16_bias, wgmma_bf16_bias_gelu, wgmma_bf16_residual, wgmma_bf16_scale;
    f16: wgmma_f16, wgmma_f16_bias, wgmma_f16_bias_gelu, wgmma_f16_residual, wgmma_f16_scale;
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host;
