//! A GEMM on the tensor cores (`mma.sync`): `C = epilogue(A·B)` for row-major A (M × K), B (K × N)
//! and C (M × N) of f16 or bf16, accumulated in f32 by `mma.sync.m16n8k16` ([`clusterfuse::mma`]).
//!
//! Each block of 256 threads computes a 128 × 128 tile of C, stepping through K 64 at a
//! time. A three-stage shared-memory pipeline keeps two k-steps of A and B in flight
//! (`cp.async`, 16 bytes per thread and copy, zero-filled past the matrices' edges) while
//! the eight warps (2 × 4) each multiply a 64 × 32 sub-tile out of the current stage:
//! `ldmatrix` into fragments (rows padded by 16 bytes, so its eight rows hit eight distinct
//! bank groups), 16 `mma.sync` per 16-wide k-slice. The epilogue — none, bias, bias + GELU,
//! residual add, scaling — is a type parameter of the device code, so each kind is its own
//! kernel with nothing of the others in it.
//!
//! Small-M GEMMs split K over a cluster of up to 8 blocks along z ([`split_k`] picks how
//! many, at launch): each block multiplies its share of the k-steps, parks its partial tile
//! in its drained pipeline, and `cluster::reduce_scatter` sums the tiles in rank order over
//! DSMEM, each block applying the epilogue to and storing 1/8-1/2 of the output tile. The
//! sum is deterministic, with no second kernel and no atomics (M = 128, a BERT layer at
//! batch 1, would otherwise run 6-24 blocks on 132 SMs).
//!
//! Shapes: any M; N and K multiples of 8 (16-byte rows for the copies). The host rejects
//! others before launching, with [`GemmError::Shape`].
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use clusterfuse::{bf16, host::Gpu};
//! use clusterfuse_kernels::gemm::{EpilogueKind, GemmType, HostOperands, Operands};
//!
//! let gpu = Gpu::new(0)?;
//! let (m, n, k) = (128, 3072, 768);
//! let host = HostOperands::<bf16>::random(&mut rand::rng(), m, n, k); // A, B, bias, residual
//! let x = Operands::upload(&gpu, &host)?;
//! let mut c = gpu.zeros::<bf16>(m * n)?;
//! let kernels = bf16::load(&gpu)?;
//! bf16::launch(&kernels, &gpu, EpilogueKind::BiasGelu, &x, &mut c, m, n, k)?; // C = GELU(A·B + bias)
//! # Ok(()) }
//! ```

use clusterfuse::arch;
use clusterfuse::mma::{mma_m16n8k16, FragA, FragB, FragC, MmaInput};
use clusterfuse::prelude::*;

/// Rows of C per block.
pub const BM: usize = 128;
/// Columns of C per block.
pub const BN: usize = 128;
/// K per pipeline stage.
pub const BK: usize = 64;
/// Pipeline stages in shared memory.
pub const STAGES: usize = 3;
/// Threads per block: 8 warps.
pub const THREADS: usize = 256;
/// Row strides of the staged A and B tiles, in elements: 16 bytes of padding per row.
const LDA: usize = BK + 8;
const LDB: usize = BN + 8;
const A_STAGE: usize = BM * LDA;
const B_STAGE: usize = BK * LDB;
/// Elements of dynamic shared memory the kernels take: every stage of A, then of B.
const SMEM_ELEMENTS: usize = STAGES * (A_STAGE + B_STAGE);
/// Dynamic shared memory per block (107 520 bytes: two blocks fit on an SM).
pub const SMEM_BYTES: u32 = (SMEM_ELEMENTS * 2) as u32;
/// The warps' 2 × 4 arrangement over the tile, and each warp's 64 × 32 sub-tile in
/// 16 × 8 mma tiles.
const WARPS_N: usize = 4;
const WM: usize = 64;
const WN: usize = 32;
const MI: usize = WM / 16;
const NI: usize = WN / 8;

/// What the kernel does to each f32 accumulator before rounding it to the output type.
pub trait Epilogue: Copy {
    /// The output at (`row`, `col`) of an `n`-column C, from its accumulator.
    fn apply(&self, acc: f32, row: usize, col: usize, n: usize) -> f32;
}

/// `C = A·B`.
#[derive(Clone, Copy)]
pub struct Plain;

/// `C = A·B + bias[col]`.
#[derive(Clone, Copy)]
pub struct Bias<'a, T>(pub &'a [T]);

/// `C = gelu(A·B + bias[col])`, GELU's tanh form ([`gelu`]).
#[derive(Clone, Copy)]
pub struct BiasGelu<'a, T>(pub &'a [T]);

/// `C = A·B + R` for an M × N residual R.
#[derive(Clone, Copy)]
pub struct Residual<'a, T>(pub &'a [T]);

/// `C = alpha · A·B`.
#[derive(Clone, Copy)]
pub struct Scale(pub f32);

/// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))` (PyTorch's `gelu(approximate="tanh")`).
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    // √(2/π) (x + 0.044715 x³) = x (√(2/π) + 0.044715 √(2/π) x²); then h + h tanh(..), h = x / 2:
    // five multiplies and adds around one `tanh.approx`.
    let inner = x * (0.035_677_408 * x).fma(x, 0.797_884_6);
    let half = 0.5 * x;
    half.fma(math::tanh(inner), half)
}

impl Epilogue for Plain {
    #[inline(always)]
    fn apply(&self, acc: f32, _: usize, _: usize, _: usize) -> f32 {
        acc
    }
}

impl<T: HalfFloat> Epilogue for Bias<'_, T> {
    #[inline(always)]
    fn apply(&self, acc: f32, _: usize, col: usize, _: usize) -> f32 {
        acc + self.0[col].to_f32()
    }
}

impl<T: HalfFloat> Epilogue for BiasGelu<'_, T> {
    #[inline(always)]
    fn apply(&self, acc: f32, _: usize, col: usize, _: usize) -> f32 {
        gelu(acc + self.0[col].to_f32())
    }
}

impl<T: HalfFloat> Epilogue for Residual<'_, T> {
    #[inline(always)]
    fn apply(&self, acc: f32, row: usize, col: usize, n: usize) -> f32 {
        acc + self.0[row * n + col].to_f32()
    }
}

impl Epilogue for Scale {
    #[inline(always)]
    fn apply(&self, acc: f32, _: usize, _: usize, _: usize) -> f32 {
        self.0 * acc
    }
}

/// Pieces of 16 bytes (8 elements) each thread copies per k-step, of A and of B.
const A_PIECES: usize = BM * BK / 8 / THREADS;
const B_PIECES: usize = BK * BN / 8 / THREADS;

/// One thread's share of the copies into the pipeline: thread `t` copies rows
/// `t / 8 + 32 i` of A's k-step (columns `8 (t % 8) ..+ 8`) and rows `t / 16 + 16 i` of B's
/// (columns `8 (t % 16) ..+ 8`), `i` in `0..4`; what does not change between steps is
/// worked out once.
struct Copier<T> {
    a: *const T,
    b: *const T,
    /// A's row `t / 8` and B's column, and whether they lie inside the matrices.
    a_row: usize,
    b_col_inside: bool,
    /// This thread's column of A's k-step and row of B's.
    a_col: usize,
    b_row: usize,
    /// Shared addresses of piece 0 in stage 0.
    a_dst: u32,
    b_dst: u32,
}

impl<T: MmaInput> Copier<T> {
    #[inline(always)]
    fn new(a: &[T], b: &[T], smem: u32, bm: usize, bn: usize, (n, k): (usize, usize)) -> Self {
        const { assert!(THREADS / (BK / 8) == 32 && THREADS / (BN / 8) == 16, "the copies' row steps are 32 (A) and 16 (B)") };
        let t = thread::rank_in_block() as usize;
        let (a_row, a_col) = (t / (BK / 8), t % (BK / 8) * 8);
        let (b_row, b_col) = (t / (BN / 8), t % (BN / 8) * 8);
        Self {
            a: a.as_ptr().wrapping_add((bm + a_row) * k + a_col),
            b: b.as_ptr().wrapping_add(b_row * n + bn + b_col),
            a_row: bm + a_row,
            b_col_inside: bn + b_col < n,
            a_col,
            b_row,
            a_dst: smem + ((a_row * LDA + a_col) * 2) as u32,
            b_dst: smem + ((STAGES * A_STAGE + b_row * LDB + b_col) * 2) as u32,
        }
    }

    /// Starts the copies of k-step `kt` into pipeline stage `stage`; pieces past the
    /// matrices' edges are zero-filled and read nothing (their addresses are never dereferenced).
    #[inline(always)]
    fn copy(&self, stage: usize, kt: usize, (m, n, k): (usize, usize, usize)) {
        self.copy_a(stage, kt, (m, k));
        self.copy_b(stage, kt, (n, k));
    }

    /// A's copies of [`Copier::copy`].
    #[inline(always)]
    fn copy_a(&self, stage: usize, kt: usize, (m, k): (usize, usize)) {
        let k0 = kt * BK;
        let a_col_inside = k0 + self.a_col < k;
        for i in 0..A_PIECES {
            let inside = a_col_inside && self.a_row + 32 * i < m;
            let src = self.a.wrapping_add(32 * i * k + k0);
            let dst = self.a_dst + ((stage * A_STAGE + 32 * i * LDA) * 2) as u32;
            // SAFETY: the destination is in this stage's A tile, which no thread reads until
            // the copy's group is waited for and a barrier passed; the source is read only
            // when inside A, and then is 16 aligned bytes of it (K is a multiple of 8).
            unsafe { arch::cp_async_cg_shared_global_16(dst, src.cast(), 16 * inside as u32) };
        }
    }

    /// B's copies of [`Copier::copy`].
    #[inline(always)]
    fn copy_b(&self, stage: usize, kt: usize, (n, k): (usize, usize)) {
        let k0 = kt * BK;
        for i in 0..B_PIECES {
            let inside = self.b_col_inside && k0 + self.b_row + 16 * i < k;
            let src = self.b.wrapping_add((k0 + 16 * i) * n);
            let dst = self.b_dst + ((stage * B_STAGE + 16 * i * LDB) * 2) as u32;
            // SAFETY: as for A (N is a multiple of 8).
            unsafe { arch::cp_async_cg_shared_global_16(dst, src.cast(), 16 * inside as u32) };
        }
    }
}

/// The block's 128 × 128 tile of `out = epilogue(a · b)`: the body of every GEMM kernel.
/// Traps unless N and K are multiples of 8 and the buffers hold the shapes.
#[inline(always)]
pub fn gemm<T: MmaInput, E: Epilogue>(a: &[T], b: &[T], out: &Out<T>, m: u32, n: u32, k: u32, epilogue: E) {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    if a.len() < m * k || b.len() < k * n || out.len() < m * n || !n.is_multiple_of(8) || !k.is_multiple_of(8) {
        arch::trap()
    }
    let smem = shared::dynamic().take::<T>(SMEM_ELEMENTS).addr();
    let (bm, bn) = (block::index().y as usize * BM, block::index_x() as usize * BN);
    const { assert!(BM * PARTIAL_STRIDE * 4 <= SMEM_ELEMENTS * 2, "the split-K partial tile fits in the pipeline's shared memory") };
    let warp = warp::index_in_block() as usize;
    let (wm, wn) = (warp / WARPS_N * WM, warp % WARPS_N * WN);
    // This lane's ldmatrix row addresses in stage 0, k-slice 0, first fragment.
    let a_lane = smem + ((wm * LDA + FragA::<T>::lane_offset(LDA)) * 2) as u32;
    let b_lane = smem + ((STAGES * A_STAGE + wn + FragB::<T>::pair_lane_offset(LDB)) * 2) as u32;

    let copier = Copier::new(a, b, smem, bm, bn, (n, k));
    let mut acc = [[FragC::ZERO; NI]; MI];
    // Split-K: the cluster's blocks (along z) take consecutive shares of the k-steps.
    let (splits, split) = (cluster::size() as usize, cluster::block_rank() as usize);
    let all_steps = k.div_ceil(BK);
    let (first, steps) = (all_steps * split / splits, all_steps * (split + 1) / splits - all_steps * split / splits);
    // B (the weights, which no kernel writes) of the first steps is in flight before waiting
    // for the kernel this one may be launched programmatically after, whose output A may be;
    // the first step's group then holds those copies too, so every wait below still covers
    // its step's B. The next kernel may start as soon as every block is here.
    for s in 0..(STAGES - 1).min(steps) {
        copier.copy_b(s, first + s, (n, k));
    }
    grid::wait_for_prerequisites();
    grid::launch_dependents();
    for s in 0..STAGES - 1 {
        if s < steps {
            copier.copy_a(s, first + s, (m, k));
        }
        arch::cp_async_commit_group();
    }
    for kt in 0..steps {
        // This thread's copies of step `kt` are done; the barrier makes everyone's visible,
        // and frees the stage step `kt - 1` used, which the next copies overwrite.
        arch::cp_async_wait_group::<{ STAGES as u32 - 2 }>();
        block::sync();
        let next = kt + STAGES - 1;
        if next < steps {
            copier.copy(next % STAGES, first + next, (m, n, k));
        }
        arch::cp_async_commit_group();
        let stage = kt % STAGES;
        for kk in 0..BK / 16 {
            let a_slice = a_lane + ((stage * A_STAGE + kk * 16) * 2) as u32;
            let b_slice = b_lane + ((stage * B_STAGE + kk * 16 * LDB) * 2) as u32;
            // SAFETY: every address lies in this stage's tiles (64 rows × 16 columns of A from
            // row `wm`, 16 rows × 32 columns of B from column `wn`, rows 16-byte aligned as
            // LDA, LDB are multiples of 8), which the barrier above made complete and no
            // thread writes until the barrier of step `kt + 1`; the whole warp runs this.
            let frag_a: [FragA<T>; MI] = core::array::from_fn(|i| unsafe { FragA::load_at(a_slice + (i * 16 * LDA * 2) as u32) });
            let mut frag_b = [FragB::from_regs([0; 2]); NI];
            for j in 0..NI / 2 {
                // SAFETY: as above.
                [frag_b[2 * j], frag_b[2 * j + 1]] = unsafe { FragB::load_pair_k_major_at(b_slice + (j * 16 * 2) as u32) };
            }
            for i in 0..MI {
                for j in 0..NI {
                    acc[i][j] = mma_m16n8k16(frag_a[i], frag_b[j], acc[i][j]);
                }
            }
        }
    }
    let store = |row: usize, col: usize, value: f32| {
        if row < m && col < n {
            out.set(row * n + col, T::from_f32(epilogue.apply(value, row, col, n)));
        }
    };
    if splits == 1 {
        // Unrolled, so that `acc` is only indexed by constants and stays in registers.
        unroll4!(|i| unroll4!(|j| unroll4!(|v| {
            let (r, c) = FragC::position(v);
            store(bm + wm + i * 16 + r, bn + wn + j * 8 + c, acc[i][j].values[v]);
        })));
        return;
    }
    // The partial tiles meet in shared memory (over the drained pipeline) and are summed
    // across the cluster in rank order, each block finishing 1/splits of the tile.
    arch::cp_async_wait_group::<0>();
    block::sync();
    // SAFETY: the first BM × PARTIAL_STRIDE f32 of the block's dynamic shared memory, which
    // holds SMEM_ELEMENTS halves (more bytes); no thread reads the pipeline any more.
    let partial = unsafe { SharedSlice::<f32>::from_raw_parts(smem, BM * PARTIAL_STRIDE) };
    unroll4!(|i| unroll4!(|j| unroll4!(|v| {
        let (r, c) = FragC::position(v);
        partial.store((wm + i * 16 + r) * PARTIAL_STRIDE + wn + j * 8 + c, acc[i][j].values[v]);
    })));
    cluster::reduce_scatter(partial, Sum, |e, value| {
        if e % PARTIAL_STRIDE < BN {
            store(bm + e / PARTIAL_STRIDE, bn + e % PARTIAL_STRIDE, value);
        }
    });
}

/// Row stride, in f32, of a split-K block's partial tile: 8 words of padding, so that a
/// warp's accumulator stores (8 rows × 4 column pairs) hit each bank at most twice.
const PARTIAL_STRIDE: usize = BN + 8;

/// `body` with `$i` bound to 0, 1, 2, 3 in turn, as constants (LLVM leaves loops this large
/// rolled, and a register array indexed at run time moves to local memory).
macro_rules! unroll4 {
    (|$i:ident| $body:expr) => {{
        const _: () = assert!(MI == 4 && NI == 4, "unroll4! covers the 4 × 4 mma tiles of a warp");
        { let $i: usize = 0; $body }
        { let $i: usize = 1; $body }
        { let $i: usize = 2; $body }
        { let $i: usize = 3; $body }
    }};
}
use unroll4;

macro_rules! gemm_kernels {
    ($($t:ident: $plain:ident, $bias:ident, $bias_gelu:ident, $residual:ident, $scale:ident;)*) => {$(
        #[doc = concat!("`out = a · b`, ", stringify!($t), "; grid (⌈N/128⌉, ⌈M/128⌉), 256 threads, [`SMEM_BYTES`] of dynamic shared memory.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $plain(a: &[$t], b: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a, b, &out, m, n, k, Plain);
        }

        #[doc = concat!("`out = a · b + bias`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $bias(a: &[$t], b: &[$t], bias: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a, b, &out, m, n, k, Bias(bias));
        }

        #[doc = concat!("`out = gelu(a · b + bias)`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $bias_gelu(a: &[$t], b: &[$t], bias: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a, b, &out, m, n, k, BiasGelu(bias));
        }

        #[doc = concat!("`out = a · b + residual`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $residual(a: &[$t], b: &[$t], residual: &[$t], out: Out<$t>, m: u32, n: u32, k: u32) {
            gemm(a, b, &out, m, n, k, Residual(residual));
        }

        #[doc = concat!("`out = alpha · a · b`, ", stringify!($t), "; launched as the plain kernel.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $scale(a: &[$t], b: &[$t], out: Out<$t>, alpha: f32, m: u32, n: u32, k: u32) {
            gemm(a, b, &out, m, n, k, Scale(alpha));
        }
    )*};
}

gemm_kernels! {
    f16: gemm_f16, gemm_f16_bias, gemm_f16_bias_gelu, gemm_f16_residual, gemm_f16_scale;
    bf16: gemm_bf16, gemm_bf16_bias, gemm_bf16_bias_gelu, gemm_bf16_residual, gemm_bf16_scale;
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host;
