//! Fused norms: LayerNorm(x + b) → GELU (BERT's epilogue) and RMSNorm(x + residual)
//! (Llama's, which also writes the new residual), each written as stages that
//! `#[fused_kernel]` composes into one kernel, and the same stages launched as separate
//! kernels, as a framework would. One block per row, one warp per 1024 values of it
//! (`block = ⌈hidden / 1024⌉ · 32`, at most 256 threads): each thread issues the loads of its
//! up to four 16-byte vectors at once and keeps the row in registers, so x is read from
//! global memory once, and a warp has 2 KB of loads in flight; small blocks of few registers
//! keep several rows per SM in flight. A thread's vectors past the row load a copy of its last
//! one, which sums and stores skip, so that the arithmetic needs no branch around a vector;
//! GELU's exact erf costs one `ex2` and a degree-6 polynomial per value. LayerNorm → GELU is
//! about 25 instructions a value at hidden 8192 (static SASS count), the GELU 10 of them.
//! Every kernel here lets the next kernel launch as it starts and waits for the previous
//! one before reading what that wrote ([`overlap_launches`]): launched with programmatic
//! dependent launch, a chain of them overlaps each grid's tail with the next one's launch.
//! Each block also asks L2 for its own row before that wait and for a row further on after
//! it ([`prefetch_row`]), so that memory streams through the previous grid's tail and while
//! the resident blocks compute. Many rows of at most 1024 values go a warp a row instead,
//! four rows a block (`layernorm_gelu_warps`, `add_rmsnorm_warps`: the same stages; [`Fused`]
//! launches the kernel a shape takes, [`warp_a_row`]).
//!
//! ```no_run
//! # fn main() -> clusterfuse::host::Result<()> {
//! use clusterfuse::{f16, host::Gpu};
//! use clusterfuse_kernels::norms::Fused;
//!
//! let gpu = Gpu::new(0)?;
//! let (rows, hidden) = (128, 4096);
//! let x = gpu.upload(&vec![f16::from_f32(0.5); rows * hidden])?;
//! let (r, w) = (gpu.upload(&vec![f16::from_f32(0.25); rows * hidden])?, gpu.upload(&vec![f16::ONE; hidden])?);
//! let (mut residual, mut out) = (gpu.zeros::<f16>(rows * hidden)?, gpu.zeros::<f16>(rows * hidden)?);
//! // residual = x + r; out = RMSNorm(residual) · w, one launch (programmatic: false).
//! Fused::load(&gpu)?.add_rmsnorm(gpu.stream(), false, &x, &r, &w, &mut residual, &mut out, hidden as u32, rows as u32)?;
//! # Ok(()) }
//! ```

use clusterfuse::arch::{self, add_rn_f16x2, cvt_rn_f16x2_f32, fma_rn_f16x2};
use clusterfuse::packed::widen8;
use clusterfuse::prelude::*;
#[cfg(not(target_arch = "nvptx64"))]
use clusterfuse::host::{Buffer, Error, Result, Stream};

/// Halves per 16-byte vector.
pub const VECTOR: u32 = 8;
/// 16-byte vectors of a row per thread, at most.
pub const VECTORS: usize = 4;
/// Values of a row per warp: 32 lanes × 4 vectors × 8 halves.
pub const PER_WARP: u32 = 32 * VECTORS as u32 * VECTOR;
/// The largest block: 8 warps.
pub const MAX_THREADS: u32 = 256;
/// The largest hidden size: 8 warps × 1024 values.
pub const MAX_HIDDEN: u32 = MAX_THREADS / 32 * PER_WARP;
/// ε of both norms.
pub const EPS: f32 = 1e-5;

/// Threads per row, i.e. per block: one warp per [`PER_WARP`] values (768 → 32, 8192 → 256).
pub const fn threads_per_row(hidden: u32) -> u32 {
    hidden.div_ceil(PER_WARP) * 32
}

/// The launch of one row per block for the unfused kernels (the fused ones have `config`).
#[cfg(not(target_arch = "nvptx64"))]
pub fn row_config(hidden: u32, rows: u32) -> LaunchConfig {
    LaunchConfig { grid: rows.into(), block: threads_per_row(hidden).into(), ..LaunchConfig::default() }
}

/// One thread's share of its block's row, in f32: `values[k]` holds the row's values
/// `8 j .. 8 j + 8` for `j = k · T + t` (thread `t` of the block's `T`), for the `k` with
/// `j < hidden / 8` ([`Row::has`]): 3 at hidden 768, 4 at 1024 and 8192, 2 or 3 at 1280.
/// The other `values[k]` hold values that [`Row::fold`] and [`store_row`] skip: the stages
/// compute on them rather than branch around each vector.
#[derive(Clone, Copy)]
pub struct Row {
    pub values: [[f32; 8]; VECTORS],
    /// `t`, `T`, and the row's vectors, `hidden / 8`.
    thread: u32,
    threads: u32,
    vectors: u32,
    /// The row's first vector in the `rows × hidden` tensor.
    start: usize,
    /// The block's rows (`rows` of them from row `first_row`), the same in every thread of the
    /// block, and whether this is the block's first thread, which asks L2 for them
    /// ([`prefetch_row`]).
    first_row: u32,
    rows: u32,
    leader: bool,
    /// The row's first value, in every thread, where the loader read it (0 from [`Row::new`]):
    /// LayerNorm's shift.
    first: f32,
    /// Whether the row is the thread's own ([`Row::of_warp`]): a warp past the tensor's rows
    /// computes on its block's first row and stores nothing.
    live: bool,
}

impl Row {
    /// This thread's share of its block's row of `hidden` values, all zero.
    #[inline(always)]
    fn new(hidden: u32) -> Self {
        let (thread, threads, vectors) = (thread::index_x(), block::dim().x, hidden / VECTOR);
        let start = block::index_x() as usize * vectors as usize;
        Self { values: [[0.0; 8]; VECTORS], thread, threads, vectors, start, first: 0.0, first_row: block::index_x(), rows: 1, leader: thread == 0, live: true }
    }

    /// This thread's share of its warp's row of `hidden` values (at most [`PER_WARP`]) of the
    /// `len` values of a tensor, all zero: warp `w` of block `b` of `W` warps (along x) takes
    /// row `b · W + w`. Traps on a longer row.
    #[inline(always)]
    fn of_warp(hidden: u32, len: usize) -> Self {
        if hidden > PER_WARP {
            arch::trap()
        }
        let (t, rows, vectors) = (thread::index_x(), block::dim().x / 32, hidden / VECTOR);
        let first_row = block::index_x() * rows;
        let row = first_row + t / 32;
        let live = (row as usize + 1) * hidden as usize <= len;
        let start = if live { row } else { first_row } as usize * vectors as usize;
        Self { values: [[0.0; 8]; VECTORS], thread: t % 32, threads: 32, vectors, start, first: 0.0, first_row, rows, leader: t == 0, live }
    }

    /// Whether `values[k]` is part of the row.
    #[inline(always)]
    pub fn has(&self, k: usize) -> bool {
        self.column(k) < self.vectors as usize
    }

    /// `f(k)` for each `k` with [`has(k)`](Row::has), written out twice: where the block's
    /// threads' vectors are exactly the row (hidden a multiple of 1024), the calls take no
    /// branch, which the per-vector test costs (3 instructions a vector).
    #[inline(always)]
    fn each_own_vector(&self, mut f: impl FnMut(usize)) {
        if self.threads * VECTORS as u32 == self.vectors {
            each_vector(&mut f);
        } else {
            each_vector(|k| {
                if self.has(k) {
                    f(k)
                }
            });
        }
    }

    /// The index of `values[k]` in vectors of the row: its vector of a per-column parameter.
    #[inline(always)]
    pub fn column(&self, k: usize) -> usize {
        (k as u32 * self.threads + self.thread) as usize
    }

    /// `f(… f(f(0, v₀), v₁) …)` over the row's values: `|s, v| s + v` sums them,
    /// `|s, v| v.fma(v, s)` their squares (rustc contracts no `s + v * v` into an FMA).
    #[inline(always)]
    pub fn fold(&self, f: impl Fn(f32, f32) -> f32) -> f32 {
        let mut sum = 0.0;
        self.each_own_vector(|k| sum = self.values[k].iter().fold(sum, |sum, &v| f(sum, v)));
        sum
    }

    /// Replaces each vector `values[k]` with `f(self, k, values[k])`, past the row too.
    #[inline(always)]
    pub fn map_vectors(&mut self, f: impl Fn(&Row, usize, [f32; 8]) -> [f32; 8]) {
        each_vector(|k| self.values[k] = f(self, k, self.values[k]));
    }

    /// Replaces each value `v` with `f(v)`, past the row too.
    #[inline(always)]
    pub fn map(&mut self, f: impl Fn(f32) -> f32) {
        each_vector(|k| {
            for v in &mut self.values[k] {
                *v = f(*v);
            }
        });
    }

    /// Σ(v − c) and Σ(v − c)² over this thread's values of the row, in one pass, each as two
    /// interleaved chains (half the latency of one).
    #[inline(always)]
    fn moments(&self, c: f32) -> [f32; 2] {
        let (mut sums, mut squares) = ([0.0f32; 2], [0.0f32; 2]);
        self.each_own_vector(|k| {
            for (e, &v) in self.values[k].iter().enumerate() {
                let d = v - c;
                sums[e % 2] += d;
                squares[e % 2] = d.fma(d, squares[e % 2]);
            }
        });
        [sums[0] + sums[1], squares[0] + squares[1]]
    }

    /// Σ of each of `values` over the row's block, in every thread ([`row_sums`] with its warps).
    #[inline(always)]
    fn sums<const N: usize>(&self, values: [f32; N], scratch: SharedSlice<f32>) -> [f32; N] {
        row_sums(values, self.threads / 32, self.thread / 32, scratch)
    }
}

/// `f(0)`, …, `f(VECTORS − 1)`, written out: LLVM leaves a loop with a large body rolled, and
/// `values[k]` indexed by a loop counter would live in local memory instead of registers.
#[inline(always)]
fn each_vector(mut f: impl FnMut(usize)) {
    const { assert!(VECTORS == 4) };
    f(0);
    f(1);
    f(2);
    f(3);
}

/// The values of a row of `x` under the one-row-per-block launch: its length over the blocks
/// (a 32-bit division: a 64-bit one is a call, around which ptxas spills; `x` under 2³² values).
#[inline(always)]
pub fn row_length(x: &[f16]) -> u32 {
    x.len() as u32 / grid::dim().x
}

/// A run of 16-byte vectors of `x` from vector `offset`, as long as a row, checked once (in
/// bounds, aligned), so that reading vector `column(k)` of it costs no check, and its address
/// one multiply-add from the run's start.
#[derive(Clone, Copy)]
struct Run<'a> {
    /// `x` from the run's first value.
    x: &'a [f16],
    /// The run's last vector.
    last: u32,
    /// Whether `x` is a parameter, which no kernel writes: read through the read-only path,
    /// which ptxas may move ahead of the wait for the previous kernel. Activations, which
    /// that kernel may write, take the coherent path.
    parameter: bool,
}

impl<'a> Run<'a> {
    /// Traps unless `x` holds vectors `offset .. offset + row.vectors` (at least one) and is
    /// aligned.
    #[inline(always)]
    fn new(x: &'a [f16], offset: usize, row: &Row) -> Self {
        let vectors = row.vectors.max(1);
        global::check16::<f16, 8>(x.as_ptr(), x.len(), offset + vectors as usize);
        // SAFETY: `8 offset <= 8 (offset + vectors) <= x.len()`, as `check16` found.
        Self { x: unsafe { x.get_unchecked(8 * offset..) }, last: vectors - 1, parameter: false }
    }

    /// Vector `row.column(k)` of the run as four f16x2, or, where `row` has no vector `k`, its
    /// last vector: a load with neither a branch nor a check.
    #[inline(always)]
    fn halves(&self, row: &Row, k: usize) -> [u32; 4] {
        let column = row.column(k).min(self.last as usize);
        // SAFETY: `column <= last`, and `new` found the run's `last + 1` vectors in bounds of
        // the 16-byte-aligned `x`; a parameter is written by the host alone.
        let h: [f16; 8] = unsafe {
            if self.parameter { global::load16_invariant_unchecked(self.x, column) } else { global::load16_unchecked(self.x, column) }
        };
        core::array::from_fn(|i| h[2 * i].to_bits() as u32 | (h[2 * i + 1].to_bits() as u32) << 16)
    }

    /// The run's first value, as the low half of an f16x2.
    #[inline(always)]
    fn first(&self) -> u32 {
        // SAFETY: `new` found at least one vector of `x` from the run's start.
        unsafe { self.x.get_unchecked(0) }.to_bits() as u32
    }

    /// Every vector of `row` as f16x2, each load issued before the first value is used.
    #[inline(always)]
    fn all(&self, row: &Row) -> [[u32; 4]; VECTORS] {
        core::array::from_fn(|k| self.halves(row, k))
    }

    /// Every vector of the run plus `other`'s (loaded) in f16 (`add.rn.f16x2`: what adding two
    /// fp16 tensors gives in PyTorch), widened to f32.
    #[inline(always)]
    fn plus(&self, other: [[u32; 4]; VECTORS], row: &Row) -> [[f32; 8]; VECTORS] {
        let a = self.all(row);
        core::array::from_fn(|k| widen8::<f16>(core::array::from_fn(|i| add_rn_f16x2(a[k][i], other[k][i]))))
    }
}

/// Lets the next kernel launch, then waits for the previous one, so that under programmatic
/// dependent launch (`LaunchConfig::programmatic`) the next kernel's blocks take the SMs this
/// grid's last blocks leave and wait there, rather than launching once it has drained: the
/// launch and the tail of the grid overlap. Both return at once under an ordinary launch.
/// Every kernel here calls it before it reads what an earlier kernel may have written.
#[inline(always)]
fn overlap_launches() {
    grid::launch_dependents();
    grid::wait_for_prerequisites();
}

/// How many rows past its own a block asks L2 for its rows ([`prefetch_row`]): the best of
/// 128-768 measured at hidden 4096 and 8192 (`results/norms-h200.md`), about a third of the
/// rows the H200's resident blocks hold at once at hidden 4096 (1056); further ahead, the
/// prefetched rows wait longer in L2 and RMSNorm's two streams lose more than LayerNorm gains.
pub const PREFETCH_AHEAD_ROWS: u32 = 384;

/// Asks L2 (one instruction, the block's first thread, at an address the same in every
/// thread) for the block's rows of `x` shifted by `ahead` rows, if they are all there. Every
/// kernel here asks for its own rows (`ahead` 0) before it waits for the previous kernel — a
/// hint, sound even while that kernel writes `x`, as L2 is where global memory is coherent —
/// so that under programmatic dependent launch the blocks that wait through the previous
/// grid's tail have their rows on the way when it completes; and for the rows
/// [`PREFETCH_AHEAD_ROWS`] on once it reads its own, so that memory keeps streaming while the
/// resident blocks compute and the block that later takes this SM finds its rows in L2.
#[inline(always)]
fn prefetch_row(x: &[f16], row: &Row, ahead: u32) {
    if row.leader {
        let values = (VECTOR * row.vectors) as usize;
        let start = (row.first_row + ahead) as usize * values;
        if let Some(next) = x.get(start..start + row.rows as usize * values) {
            global::prefetch_l2(next);
        }
    }
}

/// This thread's vectors of its block's row of `x` (`hidden` values a row), in f32, all loads
/// issued at once: x is read from global memory once. No L2 prefetch ([`prefetch_row`]): the
/// unfused kernels that load a row this way read what the kernel before them has just written.
#[inline(always)]
pub fn load_row(x: &[f16], hidden: u32) -> Row {
    let mut row = Row::new(hidden);
    overlap_launches();
    let run = Run::new(x, row.start, &row);
    row.values = run.all(&row).map(widen8::<f16>);
    row.first = f16::from_bits(run.first() as u16).to_f32();
    row
}

/// A per-column parameter (bias, γ, β, weight) of `row`'s length, which the host alone writes,
/// checked once; [`Run::halves`] reads its vector `column(k)`.
#[inline(always)]
fn columns<'a>(param: &'a [f16], row: &Row) -> Run<'a> {
    Run { parameter: true, ..Run::new(param, 0, row) }
}

/// Writes this thread's vectors of the row to `out` in f16, 16 bytes at once.
#[inline(always)]
pub fn store_row(row: Row, out: &Out<f16>) {
    if !row.live {
        return;
    }
    global::check16::<f16, 8>(out.as_mut_ptr(), out.len(), row.start + row.vectors as usize);
    // SAFETY: the row's `8 vectors` values from `8 start` lie in `out` (`check16`), which is
    // writable and aliased by no input (`Out`'s invariants), and start 16-byte aligned.
    let out = unsafe { Out::from_raw_parts(out.as_mut_ptr().add(8 * row.start), 8 * row.vectors as usize) };
    row.each_own_vector(|k| {
        // SAFETY: `has(k)`: `column(k) < vectors`, in bounds of the aligned row.
        unsafe { out.store16_rounded_unchecked(row.column(k), row.values[k]) };
    });
}

/// Σ of each of `values` over a block of `warps` warps (at most 8), in every thread: each
/// warp's sums by shuffles, then, past one warp, the warps' sums through `scratch` (`N` slots
/// a warp) after one barrier, where lane `l` of each 8 takes warp `l`'s (0 past the last warp)
/// and a sum over each 8 lanes adds them: no loop over the warps, and every thread adds the same
/// values in the same order, so gets the same totals. With no closing barrier, `scratch`
/// serves one call per block.
#[inline(always)]
fn row_sums<const N: usize>(values: [f32; N], warps: u32, warp_index: u32, scratch: SharedSlice<f32>) -> [f32; N] {
    let partial = values.map(warp::reduce_sum);
    if warps == 1 {
        return partial;
    }
    let lane = warp::lane();
    if lane == 0 {
        for (i, &p) in partial.iter().enumerate() {
            scratch.store(N * warp_index as usize + i, p);
        }
    }
    block::sync();
    let slot = lane % 8;
    core::array::from_fn(|i| {
        let sum = if slot < warps { scratch.load(N * slot as usize + i) } else { 0.0 };
        warp::group_sum::<8, f32>(sum)
    })
}

/// Beyond this |x|, GELU takes ½·erfc(|x|/√2) at this bound, 2^P(7.5) < 2^-44: |x|·q rounds to
/// 0 in f16 for every f16 x past it, as it does from |x| ≈ 5.9 on.
const GELU_TAIL: f32 = 7.5;

/// P(a) ≈ log₂(½·erfc(a/√2)) on [0, 7.5], the coefficients of a⁰ … a⁶: a minimax fit weighted
/// for an f16 result, under which, evaluated in f32, q = ½·erfc is within 7e-6 relative (1/70
/// of an f16 ulp of x·q) while x·q is a normal f16 (|x| < 4.1), within 6e-9 absolute (1/10 of
/// the smallest subnormal) below, and under 2.9e-8 (rounding to 0) from |x| = 5.9 on.
const GELU_LOG2_Q: [f32; 7] = [-1.0000076, -1.1510345, -0.45918003, -0.05303788, 0.007933607, -0.00074603, 3.220421e-5];

/// GELU with the exact erf, as BERT and `torch.nn.functional.gelu` define it, to well under
/// an ulp of its f16 result: x·Φ(x) = max(x, 0) − |x|·q, where q = ½·erfc(|x|/√2) = 2^P(|x|).
/// No branch, one `ex2`, 10 instructions.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let a = x.abs().min(GELU_TAIL);
    let p = GELU_LOG2_Q[..6].iter().rev().fold(GELU_LOG2_Q[6], |p, &c| p.fma(a, c));
    (-a).fma(math::exp2(p), math::maximum(x, 0.0))
}

/// `out = GELU(LayerNorm(x + b) · γ + β)` for `rows × hidden` (row-major; hidden a multiple of
/// 256, at most [`MAX_HIDDEN`]).
#[allow(clippy::manual_div_ceil)] // `block` takes operators, not method calls
#[fused_kernel(grid = rows, block = (hidden + 1023) / 1024 * 32, launch_bounds(max_threads = 256, min_blocks = 4))]
pub mod layernorm_gelu {
    use super::*;

    /// y = x + b in f16, kept in registers; b, a parameter, is loaded before the wait for the
    /// kernel that wrote x ([`overlap_launches`]).
    #[stage(thread)]
    pub fn add_bias(x: Global<&[f16]>, b: Global<&[f16]>) -> Registers<Row> {
        plus_bias(Row::new(b.len() as u32), x, b)
    }

    /// LayerNorm(y) · γ + β ([`normalise`]).
    #[stage(block)]
    pub fn layer_norm(y: Registers<Row>, gamma: Global<&[f16]>, beta: Global<&[f16]>, hidden: u32) -> Registers<Row> {
        // Two slots per warp of the block (at most 8).
        normalise(y, gamma, beta, hidden, shared!([f32; 16]))
    }

    /// out = GELU(z), written as f16.
    #[stage(thread)]
    pub fn gelu_out(mut z: Registers<Row>, out: Global<Out<f16>>) {
        z.map(gelu);
        store_row(z, out);
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    pub fn kernel(x: &[f16], b: &[f16], gamma: &[f16], beta: &[f16], out: Out<f16>, hidden: u32, rows: u32) {
        let y = add_bias(x, b);
        let z = layer_norm(y, gamma, beta, hidden);
        gelu_out(z, out);
    }
}

/// y = x + b in f16 for `y`'s row, kept in registers; b, a parameter, is loaded before the
/// wait for the kernel that wrote x ([`overlap_launches`]).
#[inline(always)]
fn plus_bias(mut y: Row, x: &[f16], b: &[f16]) -> Row {
    let (run, b) = (Run::new(x, y.start, &y), columns(b, &y));
    let bias = b.all(&y);
    prefetch_row(x, &y, 0);
    overlap_launches();
    y.values = run.plus(bias, &y);
    y.first = f16::from_bits(add_rn_f16x2(run.first(), b.first()) as u16).to_f32();
    prefetch_row(x, &y, PREFETCH_AHEAD_ROWS);
    y
}

/// (y − μ) / √(σ² + ε) · γ + β, with Σ(y − c) and Σ(y − c)² reduced over the row's warps
/// together (through `sums`, two slots a warp, after one barrier, past one warp), shifted by
/// the row's first value c so that σ² = mean((y − c)²) − (μ − c)² cancels little (|μ − c| is
/// of the order of σ); the affine step in f16 (`fma.rn.f16x2`), whose result PyTorch's fp16
/// LayerNorm also rounds to f16.
#[inline(always)]
fn normalise(mut y: Row, gamma: &[f16], beta: &[f16], hidden: u32, sums: SharedSlice<f32>) -> Row {
    // `rcp.approx`: exact at powers of two, within an ulp elsewhere, and no division's slow path.
    let inverse = math::rcp(hidden as f32);
    let [sum, squares] = y.sums(y.moments(y.first), sums);
    let shift = sum * inverse;
    let rstd = math::rsqrt(math::maximum((-shift).fma(shift, squares * inverse), 0.0) + EPS);
    // (y − μ)·rstd as one FMA: y·rstd − μ·rstd.
    let offset = -(y.first + shift) * rstd;
    // γ and β a vector at a time, as loaded, into as few registers as possible.
    let (gamma, beta) = (columns(gamma, &y), columns(beta, &y));
    y.map_vectors(|row, k, d| {
        let (g, b) = (gamma.halves(row, k), beta.halves(row, k));
        let n: [f32; 8] = core::array::from_fn(|e| d[e].fma(rstd, offset));
        widen8::<f16>(core::array::from_fn(|i| fma_rn_f16x2(cvt_rn_f16x2_f32(n[2 * i + 1], n[2 * i]), g[i], b[i])))
    });
    y
}

/// `h = x + r` (rounded to f16, written to `residual_out`), then
/// `out = h / √(mean(h²) + ε) · w`, for `rows × hidden` (as for `layernorm_gelu`).
#[allow(clippy::manual_div_ceil)] // `block` takes operators, not method calls
#[fused_kernel(grid = rows, block = (hidden + 1023) / 1024 * 32, launch_bounds(max_threads = 256))]
pub mod add_rmsnorm {
    use super::*;

    /// h = x + r in f16: the next layer's residual, written out and kept in registers.
    #[stage(thread)]
    pub fn add_residual(x: Global<&[f16]>, r: Global<&[f16]>, residual_out: Global<Out<f16>>, hidden: u32) -> Registers<Row> {
        plus_residual(Row::new(hidden), x, r, residual_out)
    }

    /// out = h · rsqrt(mean(h²) + ε) · w ([`rms_normalise`]).
    #[stage(block)]
    pub fn rms_norm(h: Registers<Row>, weight: Global<&[f16]>, out: Global<Out<f16>>, hidden: u32) {
        // A slot per warp of the block (at most 8).
        rms_normalise(h, weight, out, hidden, shared!([f32; 8]));
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    #[allow(clippy::too_many_arguments)]
    pub fn kernel(x: &[f16], residual: &[f16], weight: &[f16], residual_out: Out<f16>, out: Out<f16>, hidden: u32, rows: u32) {
        let h = add_residual(x, residual, residual_out, hidden);
        rms_norm(h, weight, out, hidden);
    }
}

/// h = x + r in f16 for `h`'s row: written to `residual_out` and kept in registers.
#[inline(always)]
fn plus_residual(mut h: Row, x: &[f16], r: &[f16], residual_out: &Out<f16>) -> Row {
    prefetch_row(x, &h, 0);
    prefetch_row(r, &h, 0);
    overlap_launches();
    h.values = Run::new(x, h.start, &h).plus(Run::new(r, h.start, &h).all(&h), &h);
    prefetch_row(x, &h, PREFETCH_AHEAD_ROWS);
    prefetch_row(r, &h, PREFETCH_AHEAD_ROWS);
    store_row(h, residual_out);
    h
}

/// out = h · rsqrt(mean(h²) + ε) · w, Σh² reduced over the row's warps (through `squares`, a
/// slot a warp, after one barrier, past one warp).
#[inline(always)]
fn rms_normalise(mut h: Row, weight: &[f16], out: &Out<f16>, hidden: u32, squares: SharedSlice<f32>) {
    let weight = columns(weight, &h);
    let [squares] = h.sums([h.fold(|s, v| v.fma(v, s))], squares);
    let rstd = math::rsqrt(squares / hidden as f32 + EPS);
    // A vector at a time, skipping those past the row: the branch keeps one weight load in
    // flight, not four, and RMSNorm at 48 registers (62 with four).
    h.map_vectors(|row, k, h| {
        if !row.has(k) {
            return h;
        }
        let w = widen8::<f16>(weight.halves(row, k));
        core::array::from_fn(|e| h[e] * rstd * w[e])
    });
    store_row(h, out);
}

/// Whether `rows × hidden` takes the warp-a-row kernels ([`layernorm_gelu_warps`],
/// [`add_rmsnorm_warps`]): rows of at most [`PER_WARP`] values, which [`layernorm_gelu`] and
/// [`add_rmsnorm`] launch as blocks of one warp, and at least [`WARP_A_ROW_FROM`] of them.
/// Measured on the H200 (`results/norms-h200.md`, session 15): at 4096 rows of 768 and 1024,
/// LayerNorm → GELU takes 21% and 13% less time a warp a row than a block a row, RMSNorm 3%
/// and the same; at 2048 rows LayerNorm → GELU 8-12% less.
pub const fn warp_a_row(hidden: u32, rows: u32) -> bool {
    hidden <= PER_WARP && rows >= WARP_A_ROW_FROM
}

/// The fewest rows [`warp_a_row`] takes: from 2048 rows a warp a row is clearly faster; at
/// 1024 it gained 1-7% head to head, and at 512 it was as fast or faster there but 6-15%
/// slower in `norms-bench` (whose parameters have copies of their own).
pub const WARP_A_ROW_FROM: u32 = 2048;

/// [`layernorm_gelu`] for rows of at most [`PER_WARP`] values, a warp a row, `ROWS` rows a
/// block: the same stages on a [`Row::of_warp`], reduced by shuffles alone.
#[allow(clippy::manual_div_ceil)] // `grid` takes operators, not method calls
#[fused_kernel(grid = (rows + ROWS - 1) / ROWS, block = ROWS * 32, launch_bounds(max_threads = 128, min_blocks = 8))]
pub mod layernorm_gelu_warps {
    use super::*;

    /// Rows a block.
    pub const ROWS: u32 = 4;

    /// y = x + b ([`plus_bias`]).
    #[stage(thread)]
    pub fn add_bias(x: Global<&[f16]>, b: Global<&[f16]>) -> Registers<Row> {
        plus_bias(Row::of_warp(b.len() as u32, x.len()), x, b)
    }

    /// LayerNorm(y) · γ + β ([`normalise`]), reduced by shuffles alone (the two slots, a
    /// row's one warp's, are never read).
    #[stage(warp)]
    pub fn layer_norm(y: Registers<Row>, gamma: Global<&[f16]>, beta: Global<&[f16]>, hidden: u32) -> Registers<Row> {
        normalise(y, gamma, beta, hidden, shared!([f32; 2]))
    }

    /// out = GELU(z), written as f16.
    #[stage(thread)]
    pub fn gelu_out(z: Registers<Row>, out: Global<Out<f16>>) {
        layernorm_gelu::gelu_out(z, out);
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    pub fn kernel(x: &[f16], b: &[f16], gamma: &[f16], beta: &[f16], out: Out<f16>, hidden: u32, rows: u32) {
        let y = add_bias(x, b);
        let z = layer_norm(y, gamma, beta, hidden);
        gelu_out(z, out);
    }
}

/// [`add_rmsnorm`] for rows of at most [`PER_WARP`] values, a warp a row, `ROWS` rows a block
/// (as [`layernorm_gelu_warps`]).
#[allow(clippy::manual_div_ceil)] // `grid` takes operators, not method calls
#[fused_kernel(grid = (rows + ROWS - 1) / ROWS, block = ROWS * 32, launch_bounds(max_threads = 128, min_blocks = 8))]
pub mod add_rmsnorm_warps {
    use super::*;

    /// Rows a block.
    pub const ROWS: u32 = 4;

    /// h = x + r ([`plus_residual`]).
    #[stage(thread)]
    pub fn add_residual(x: Global<&[f16]>, r: Global<&[f16]>, residual_out: Global<Out<f16>>, hidden: u32) -> Registers<Row> {
        plus_residual(Row::of_warp(hidden, x.len()), x, r, residual_out)
    }

    /// out = h · rsqrt(mean(h²) + ε) · w ([`rms_normalise`]), reduced by shuffles alone (the
    /// slot is never read).
    #[stage(warp)]
    pub fn rms_norm(h: Registers<Row>, weight: Global<&[f16]>, out: Global<Out<f16>>, hidden: u32) {
        rms_normalise(h, weight, out, hidden, shared!([f32; 1]));
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    #[allow(clippy::too_many_arguments)]
    pub fn kernel(x: &[f16], residual: &[f16], weight: &[f16], residual_out: Out<f16>, out: Out<f16>, hidden: u32, rows: u32) {
        let h = add_residual(x, residual, residual_out, hidden);
        rms_norm(h, weight, out, hidden);
    }
}

/// Both fused ops, each launched as the kernel its shape takes ([`warp_a_row`]).
#[cfg(not(target_arch = "nvptx64"))]
pub struct Fused {
    ln: layernorm_gelu::Kernel,
    ln_warps: layernorm_gelu_warps::Kernel,
    rms: add_rmsnorm::Kernel,
    rms_warps: add_rmsnorm_warps::Kernel,
}

#[cfg(not(target_arch = "nvptx64"))]
impl Fused {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        Ok(Self { ln: layernorm_gelu::load(gpu)?, ln_warps: layernorm_gelu_warps::load(gpu)?, rms: add_rmsnorm::load(gpu)?, rms_warps: add_rmsnorm_warps::load(gpu)? })
    }

    /// `out = GELU(LayerNorm(x + b) · γ + β)` over `rows × hidden` (row-major), with
    /// programmatic dependent launch if `programmatic`; [`Error::UnsupportedShape`] unless
    /// hidden is a positive multiple of 256 up to [`MAX_HIDDEN`] and the buffers hold the
    /// shape (`b`, `gamma`, `beta`: `hidden` values).
    #[allow(clippy::too_many_arguments)]
    pub fn layernorm_gelu(&self, s: &Stream, programmatic: bool, x: &Buffer<f16>, b: &Buffer<f16>, gamma: &Buffer<f16>, beta: &Buffer<f16>, out: &mut Buffer<f16>, hidden: u32, rows: u32) -> Result<()> {
        check_shape("layernorm_gelu", hidden, rows, &[x, out], &[b, gamma, beta])?;
        if warp_a_row(hidden, rows) {
            self.ln_warps.launch(s, &LaunchConfig { programmatic, ..layernorm_gelu_warps::config(rows) }, x, b, gamma, beta, out, hidden, rows)
        } else {
            self.ln.launch(s, &LaunchConfig { programmatic, ..layernorm_gelu::config(hidden, rows) }, x, b, gamma, beta, out, hidden, rows)
        }
    }

    /// `residual_out = x + r`, `out = RMSNorm(residual_out) · w` over `rows × hidden`, with
    /// programmatic dependent launch if `programmatic`; [`Error::UnsupportedShape`] as
    /// [`Fused::layernorm_gelu`] (`w`: `hidden` values).
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm(&self, s: &Stream, programmatic: bool, x: &Buffer<f16>, r: &Buffer<f16>, w: &Buffer<f16>, residual_out: &mut Buffer<f16>, out: &mut Buffer<f16>, hidden: u32, rows: u32) -> Result<()> {
        check_shape("add_rmsnorm", hidden, rows, &[x, r, residual_out, out], &[w])?;
        if warp_a_row(hidden, rows) {
            self.rms_warps.launch(s, &LaunchConfig { programmatic, ..add_rmsnorm_warps::config(rows) }, x, r, w, residual_out, out, hidden, rows)
        } else {
            self.rms.launch(s, &LaunchConfig { programmatic, ..add_rmsnorm::config(hidden, rows) }, x, r, w, residual_out, out, hidden, rows)
        }
    }
}

/// Whether the fused kernels take `rows × hidden` with these buffers: `rows` of the `rows`
/// (activations) and a row of the `params`.
#[cfg(not(target_arch = "nvptx64"))]
fn check_shape(kernel: &'static str, hidden: u32, rows: u32, rows_of: &[&Buffer<f16>], params: &[&Buffer<f16>]) -> Result<()> {
    let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel, reason });
    if hidden == 0 || !hidden.is_multiple_of(256) || hidden > MAX_HIDDEN {
        return unsupported(format!("hidden {hidden}: a positive multiple of 256 up to {MAX_HIDDEN}"));
    }
    let (row, all) = (hidden as usize, rows as usize * hidden as usize);
    match (rows_of.iter().find(|b| b.len() < all), params.iter().find(|b| b.len() < row)) {
        (Some(b), _) => unsupported(format!("{rows} rows × {hidden} need {all} values; an activation buffer holds {}", b.len())),
        (_, Some(b)) => unsupported(format!("hidden {hidden} needs {row} parameters; a parameter buffer holds {}", b.len())),
        _ => Ok(()),
    }
}

// The same stages as separate kernels, one per stage, f16 intermediates in global memory.

/// Unfused 1/3: `y = x + b`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn add_bias(x: &[f16], b: &[f16], y: Out<f16>) {
    store_row(layernorm_gelu::add_bias(x, b), &y);
}

/// Unfused 2/3: `z = LayerNorm(y) · γ + β`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn layer_norm(y: &[f16], gamma: &[f16], beta: &[f16], z: Out<f16>, hidden: u32) {
    store_row(layernorm_gelu::layer_norm(load_row(y, hidden), gamma, beta, hidden), &z);
}

/// Unfused 3/3: `out = GELU(z)`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn gelu_kernel(z: &[f16], out: Out<f16>) {
    layernorm_gelu::gelu_out(load_row(z, row_length(z)), &out);
}

/// Unfused 1/2: `residual_out = x + r`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn add_residual(x: &[f16], r: &[f16], residual_out: Out<f16>) {
    add_rmsnorm::add_residual(x, r, &residual_out, row_length(x));
}

/// Unfused 2/2: `out = RMSNorm(h) · w`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn rms_norm(h: &[f16], weight: &[f16], out: Out<f16>, hidden: u32) {
    add_rmsnorm::rms_norm(load_row(h, hidden), weight, &out, hidden);
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod reference {
    //! f64 references of both fused kernels.

    /// erf(x), and 1 − |erf(x)| = erfc(|x|) to about 1e-13 relative: its Taylor series below 2,
    /// the continued fraction of erfc above (the asymptotic series, used before, is off by
    /// 1e-4 of erfc at 3, a tenth of an f16 ulp of GELU's tail).
    pub fn erf(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 2.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            // erfc(a) = e^(−a²)/√π / (a + ½/(a + 1/(a + (3/2)/(a + …)))), from its 200th term.
            let fraction = (1..=200).rev().fold(a, |f, k| a + k as f64 / 2.0 / f);
            1.0 - (-a * a).exp() / std::f64::consts::PI.sqrt() / fraction
        };
        r.copysign(x)
    }

    /// GELU(LayerNorm(x + b) · γ + β), row by row, of x and b in f16 (their sum rounded to f16).
    pub fn layernorm_gelu(x: &[f32], b: &[f32], gamma: &[f32], beta: &[f32], eps: f64) -> Vec<f64> {
        let hidden = b.len();
        x.chunks(hidden)
            .flat_map(|row| {
                // x + b in f16, as the kernels and PyTorch add two fp16 tensors.
                let y: Vec<f64> = row.iter().zip(b).map(|(&x, &b)| super::f16::from_f32(x + b).to_f32() as f64).collect();
                let mean = y.iter().sum::<f64>() / hidden as f64;
                let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / hidden as f64;
                let rstd = 1.0 / (var + eps).sqrt();
                (0..hidden)
                    .map(|i| {
                        let z = (y[i] - mean) * rstd * gamma[i] as f64 + beta[i] as f64;
                        0.5 * z * (1.0 + erf(z / std::f64::consts::SQRT_2))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// RMSNorm(h) · w of the residual `h` (already rounded to f16, as the kernels store it).
    pub fn rmsnorm(h: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
        let hidden = w.len();
        h.chunks(hidden)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / hidden as f64;
                let rstd = 1.0 / (ms + eps).sqrt();
                row.iter().zip(w).map(move |(&v, &w)| v as f64 * rstd * w as f64)
            })
            .collect()
    }
}

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests {
    use super::{f16, gelu, reference};

    /// x·½(1 + erf(x/√2)) in f64.
    fn exact(x: f32) -> f64 {
        x as f64 * 0.5 * (1.0 + reference::erf(x as f64 / std::f64::consts::SQRT_2))
    }

    /// The spacing of f16 values at `v`: 2^-24 among the subnormals.
    fn f16_ulp(v: f64) -> f64 {
        (v.abs().max(2f64.powi(-14)).log2().floor() - 10.0).exp2()
    }

    /// GELU's error, in ulps of its f16 result.
    fn ulps(x: f32) -> f64 {
        let e = exact(x);
        (gelu(x) as f64 - e).abs() / f16_ulp(e)
    }

    /// The branch-free GELU against x·½(1 + erf(x/√2)) in f64, over x in [-12, 12] in steps of
    /// 1e-4: within 1/40 of an ulp of its f16 result (the fit gives 0.019), so that it rounds
    /// as the exact GELU does but where that lies within 1/40 ulp of halfway between two.
    #[test]
    fn gelu_is_exact_erf_gelu_to_well_under_an_f16_ulp() {
        let worst = (-120_000..=120_000).map(|i| ulps(i as f32 * 1e-4)).fold(0.0, f64::max);
        assert!(worst < 0.025, "GELU error {worst:e} f16 ulp");
        assert!(gelu(f32::NAN).is_nan());
        assert_eq!(gelu(f32::INFINITY), f32::INFINITY);
    }

    /// Every finite f16 input (LayerNorm's output), rounded to f16 as the kernel stores it: the
    /// same error bound, and the f16 result is the exact GELU's nearest f16 or, within 1/40 ulp
    /// of a tie, its neighbour; 0 for every x below -5.9.
    #[test]
    fn gelu_of_every_f16_rounds_as_the_exact_gelu() {
        for bits in 0..=u16::MAX {
            let x = f16::from_bits(bits).to_f32();
            if !x.is_finite() {
                continue;
            }
            let (e, g) = (exact(x), f16::from_f32(gelu(x)).to_f32() as f64);
            assert!(ulps(x) < 0.025, "GELU({x}) error {:e} f16 ulp", ulps(x));
            assert!((g - e).abs() <= 0.525 * f16_ulp(e), "GELU({x}) = {g} rounds away from {e}");
            if x < -5.9 {
                assert_eq!(g, 0.0, "GELU({x})");
            }
        }
    }
}
