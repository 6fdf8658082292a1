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
mod host {
    use super::*;
    use clusterfuse::host::cudarc::driver::DeviceRepr;
    use clusterfuse::host::{Buffer, Error, Result};
    use clusterfuse::Dim3;
    use rand::Rng;
    use std::fmt;

    /// Which epilogue: each is its own kernel.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum EpilogueKind {
        None,
        Bias,
        BiasGelu,
        Residual,
        Scale,
    }

    impl EpilogueKind {
        /// Every kind, in the order the examples run them.
        pub const ALL: [EpilogueKind; 5] = [Self::None, Self::Bias, Self::BiasGelu, Self::Residual, Self::Scale];

        /// The kind's name in reports.
        pub fn name(self) -> &'static str {
            match self {
                Self::None => "none",
                Self::Bias => "bias",
                Self::BiasGelu => "bias+gelu",
                Self::Residual => "residual",
                Self::Scale => "scale",
            }
        }

        /// The f64 reference of the output at (`row`, `col`) from the exact product `dot`.
        pub fn reference<T: HalfFloat>(self, dot: f64, row: usize, col: usize, n: usize, operands: &HostOperands<T>) -> f64 {
            let value = |v: T| v.to_f32() as f64;
            match self {
                Self::None => dot,
                Self::Bias => dot + value(operands.bias[col]),
                Self::BiasGelu => {
                    let x = dot + value(operands.bias[col]);
                    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
                }
                Self::Residual => dot + value(operands.residual[row * n + col]),
                Self::Scale => operands.alpha as f64 * dot,
            }
        }
    }

    /// Why a GEMM was not launched, or failed.
    #[derive(Debug)]
    pub enum GemmError {
        /// The shape is not supported, or a buffer does not hold it: what and why.
        Shape(String),
        /// The launch itself failed.
        Launch(Error),
    }

    impl fmt::Display for GemmError {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Self::Shape(what) => write!(f, "unsupported GEMM: {what}"),
                Self::Launch(err) => write!(f, "{err}"),
            }
        }
    }

    impl std::error::Error for GemmError {}

    impl From<Error> for GemmError {
        fn from(err: Error) -> Self {
            Self::Launch(err)
        }
    }

    /// The launch configuration of an M × N × K GEMM, or why the kernels cannot compute it.
    pub fn config(m: usize, n: usize, k: usize) -> std::result::Result<LaunchConfig, GemmError> {
        let reject = |what: String| Err(GemmError::Shape(format!("M = {m}, N = {n}, K = {k}: {what}")));
        if m == 0 || n == 0 || k == 0 {
            return reject("every dimension must be at least 1".into());
        }
        if !n.is_multiple_of(8) || !k.is_multiple_of(8) {
            return reject("N and K must be multiples of 8 (rows of A, B and C are copied 16 bytes at a time); pad them".into());
        }
        if m.div_ceil(BM) > 65535 || m * k > u32::MAX as usize || k * n > u32::MAX as usize || m * n > u32::MAX as usize {
            return reject("too large: at most 65535 row tiles of 128 and 2^32 elements per matrix".into());
        }
        let splits = split_k(n.div_ceil(BN) * m.div_ceil(BM), k.div_ceil(BK));
        Ok(LaunchConfig {
            grid: (n.div_ceil(BN) as u32, m.div_ceil(BM) as u32, splits).into(),
            block: (THREADS as u32).into(),
            cluster: (splits > 1).then(|| Dim3::new(1, 1, splits)),
            dynamic_smem_bytes: SMEM_BYTES,
            ..LaunchConfig::default()
        })
    }

    /// Blocks per output tile (a cluster along z, splitting K): doubled from 1 while the grid
    /// stays within one wave of two blocks per SM of an H200 (132 SMs) and every block keeps
    /// two k-steps, up to the portable cluster of 8. Small-M GEMMs (a BERT layer at batch 1:
    /// M = 128, 6-24 tiles) would otherwise leave most SMs idle. (One k-step a block was
    /// slower on the H200: the reduction over DSMEM then outweighs the split work.)
    pub fn split_k(tiles: usize, steps: usize) -> u32 {
        let mut splits = 1;
        while splits < 8 && tiles * splits * 2 <= 2 * 132 && steps >= 2 * (splits * 2) {
            splits *= 2;
        }
        splits as u32
    }

    /// The GEMM's inputs on the host.
    pub struct HostOperands<T> {
        pub a: Vec<T>,
        pub b: Vec<T>,
        pub bias: Vec<T>,
        pub residual: Vec<T>,
        pub alpha: f32,
    }

    impl<T: HalfFloat> HostOperands<T> {
        /// Fresh random operands of an M × N × K GEMM, uniform in [-1, 1).
        pub fn random(rng: &mut impl Rng, m: usize, n: usize, k: usize) -> Self {
            let mut values = |len: usize| (0..len).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect::<Vec<T>>();
            let (a, b, bias, residual) = (values(m * k), values(k * n), values(n), values(m * n));
            Self { a, b, bias, residual, alpha: rng.random_range(0.5..2.0) }
        }

        /// `Σ_k a[row, k] · b[k, col]`, exactly (in f64).
        pub fn dot(&self, row: usize, col: usize, n: usize, k: usize) -> f64 {
            (0..k).map(|i| self.a[row * k + i].to_f32() as f64 * self.b[i * n + col].to_f32() as f64).sum()
        }
    }

    /// The GEMM's inputs on a device.
    pub struct Operands<T> {
        pub a: Buffer<T>,
        pub b: Buffer<T>,
        pub bias: Buffer<T>,
        pub residual: Buffer<T>,
        pub alpha: f32,
    }

    impl<T: DeviceRepr + Copy> Operands<T> {
        /// Copies `host` to `gpu`.
        pub fn upload(gpu: &Gpu, host: &HostOperands<T>) -> Result<Self> {
            Ok(Self {
                a: gpu.upload(&host.a)?,
                b: gpu.upload(&host.b)?,
                bias: gpu.upload(&host.bias)?,
                residual: gpu.upload(&host.residual)?,
                alpha: host.alpha,
            })
        }
    }

    /// An element type of the GEMM kernels, with its five kernels loaded.
    pub trait GemmType: HalfFloat + DeviceRepr + Copy {
        /// The type's name in reports.
        const NAME: &'static str;
        /// The kernels of this type, loaded on one device.
        type Kernels;
        /// Loads the five kernels.
        fn load(gpu: &Gpu) -> Result<Self::Kernels>;
        /// `out = epilogue(a · b)` for an M × N × K GEMM, after checking the shape and buffers.
        #[allow(clippy::too_many_arguments)]
        fn launch(
            kernels: &Self::Kernels,
            gpu: &Gpu,
            epilogue: EpilogueKind,
            x: &Operands<Self>,
            out: &mut Buffer<Self>,
            m: usize,
            n: usize,
            k: usize,
        ) -> std::result::Result<(), GemmError>;
    }

    /// Checks that the buffers hold an M × N × K GEMM's operands.
    fn check_buffers<T>(x: &Operands<T>, out: &Buffer<T>, epilogue: EpilogueKind, (m, n, k): (usize, usize, usize)) -> std::result::Result<(), GemmError> {
        let mut needs = vec![("A", x.a.len(), m * k), ("B", x.b.len(), k * n), ("C", out.len(), m * n)];
        match epilogue {
            EpilogueKind::Bias | EpilogueKind::BiasGelu => needs.push(("bias", x.bias.len(), n)),
            EpilogueKind::Residual => needs.push(("residual", x.residual.len(), m * n)),
            EpilogueKind::None | EpilogueKind::Scale => {}
        }
        match needs.into_iter().find(|&(_, len, need)| len < need) {
            Some((what, len, need)) => Err(GemmError::Shape(format!("{what} holds {len} elements; M = {m}, N = {n}, K = {k} needs {need}"))),
            None => Ok(()),
        }
    }

    macro_rules! gemm_type {
        ($($t:ident, $kernels:ident, $name:literal: $plain:ident, $bias:ident, $bias_gelu:ident, $residual:ident, $scale:ident;)*) => {$(
            #[doc = concat!("The ", $name, " GEMM kernels, loaded.")]
            pub struct $kernels {
                plain: $plain::Kernel,
                bias: $bias::Kernel,
                bias_gelu: $bias_gelu::Kernel,
                residual: $residual::Kernel,
                scale: $scale::Kernel,
            }

            impl GemmType for $t {
                const NAME: &'static str = $name;
                type Kernels = $kernels;

                fn load(gpu: &Gpu) -> Result<$kernels> {
                    Ok($kernels {
                        plain: $plain::load(gpu)?,
                        bias: $bias::load(gpu)?,
                        bias_gelu: $bias_gelu::load(gpu)?,
                        residual: $residual::load(gpu)?,
                        scale: $scale::load(gpu)?,
                    })
                }

                fn launch(kernels: &$kernels, gpu: &Gpu, epilogue: EpilogueKind, x: &Operands<$t>, out: &mut Buffer<$t>, m: usize, n: usize, k: usize) -> std::result::Result<(), GemmError> {
                    let config = config(m, n, k)?;
                    check_buffers(x, out, epilogue, (m, n, k))?;
                    let (s, (m, n, k)) = (gpu.stream(), (m as u32, n as u32, k as u32));
                    match epilogue {
                        EpilogueKind::None => kernels.plain.launch(s, &config, &x.a, &x.b, out, m, n, k)?,
                        EpilogueKind::Bias => kernels.bias.launch(s, &config, &x.a, &x.b, &x.bias, out, m, n, k)?,
                        EpilogueKind::BiasGelu => kernels.bias_gelu.launch(s, &config, &x.a, &x.b, &x.bias, out, m, n, k)?,
                        EpilogueKind::Residual => kernels.residual.launch(s, &config, &x.a, &x.b, &x.residual, out, m, n, k)?,
                        EpilogueKind::Scale => kernels.scale.launch(s, &config, &x.a, &x.b, out, x.alpha, m, n, k)?,
                    }
                    Ok(())
                }
            }
        )*};
    }

    gemm_type! {
        f16, F16Kernels, "f16": gemm_f16, gemm_f16_bias, gemm_f16_bias_gelu, gemm_f16_residual, gemm_f16_scale;
        bf16, Bf16Kernels, "bf16": gemm_bf16, gemm_bf16_bias, gemm_bf16_bias_gelu, gemm_bf16_residual, gemm_bf16_scale;
    }

    /// Relative error allowed: the output's rounding (2^-11 for f16, 2^-8 for bf16) with
    /// room for `tanh.approx` in GELU and the f32 accumulation over K.
    pub const F16_TOLERANCE: f64 = 1e-3;
    /// See [`F16_TOLERANCE`].
    pub const BF16_TOLERANCE: f64 = 5e-3;
}
