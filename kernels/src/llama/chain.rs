//! A whole decode step of a Llama-3.2-1B-shaped model (16 layers, hidden 2048, 32 query
//! and 8 key/value heads of 64, MLP 8192, vocabulary 128256 with the embedding tied to the LM
//! head) at batch 1: bf16 weights and KV cache, f32 activations and arithmetic, built from six
//! fused kernels chained by programmatic dependent launch and replayed from one CUDA graph.
//!
//! A step is 82 launches: [`fn@llama_embed`] (the new token's embedding row, widened to f32,
//! becomes the residual stream `h`), then per layer
//! 1. [`fn@llama_qkv`]: RMSNorm + the QKV projection + RoPE (rotate-half, θ = 500 000) + the
//!    new k, v appended to the layer's cache at `position`;
//! 2. [`fn@llama_attention`]: grouped-query flash-decoding, a cluster of `C` blocks per KV head
//!    splitting the cached tokens, each block serving the head's 4 query heads; a warp's 4
//!    lane groups merge by shuffles, the block's warps through shared memory, and rank 0
//!    merges the blocks' states through DSMEM in rank order (all loads issued before any is
//!    used), between two cluster barriers;
//! 3. [`fn@llama_residual`]: `h += W_o · attn`;
//! 4. [`fn@llama_gate_up`]: RMSNorm + gate and up projections, `act = silu(gate) · up`;
//! 5. [`fn@llama_residual`]: `h += W_down · act` (K = 8192, split over the block's warps);
//!
//! then [`fn@llama_lm_head`]: the final RMSNorm and `logits = E · h` over the whole vocabulary.
//!
//! **The projections** (every weight byte of the step) share one plan, built to keep many
//! bytes in flight: a warp owns a *pair* of rows and a chunk of up to 2048 columns of both,
//! and each lane issues all of its 16 loads of 16 bytes (two rows × 8 vectors, 256 bytes)
//! before anything else — before the kernel even waits for the previous one, since weights do
//! not depend on it ([`grid::wait_for_prerequisites`] comes after the loads; every kernel calls
//! [`grid::launch_dependents`] at once, so the next kernel's blocks take SM slots as soon as
//! they free and put their own weight loads in flight; the QKV kernel's norm vector, position
//! and RoPE factors load before the wait too, and the residual projections load `h` with the
//! staging, not after the dot products). Blocks of 256 threads at ≤ 128 registers, two per
//! SM: 128 KB of weights in flight per SM. A grid has at most two blocks per SM: a block
//! takes a block's worth of row pairs (an *item*) after another, loading the next item's
//! weights right after an item's epilogue, so that the gate/up, down and LM head projections
//! run as one wave (no block ends, starts and stages its input again between items). Each
//! block stages its input vector (the normalised `h`, `attn` or `act`, f32) in shared memory
//! once, with RMSNorm's `1/rms` applied after the dot products so the staging needs no
//! reduction first; warps reduce their two dot products with shuffles, and the block sums the
//! chunks of a pair in chunk order (no atomics: every output is deterministic). Row pairs: `(r, r + 32)` of a
//! head for the QKV projection (so that RoPE's rotate-half partners meet in one thread),
//! `(g, 8192 + g)` for gate and up (so that one thread forms `silu(gate) · up`), `(2p, 2p + 1)`
//! elsewhere.
//!
//! The attention reads cached tokens `0 .. position` (and starts loading them before waiting
//! for the QKV kernel, which writes only token `position`); rank 0's first group starts its
//! online softmax from the new token.
//!
//! Everything a kernel reads that another kernel of the step writes — `h`, `q`, `attn`, `act`,
//! the caches — is an `Out` parameter read through the coherent path: with programmatic
//! dependent launch the writer may still be running when the reader starts, which the
//! read-only path's contract (nothing written while the kernel runs) does not allow. Weights
//! and norms are written by the host alone: read-only path ([`global::load16_invariant`]).

use clusterfuse::arch;
use clusterfuse::global::Coherent;
use clusterfuse::packed::{dot8, widen8, words};
use clusterfuse::prelude::*;
use core::ops::Range;

/// Dimensions per head.
pub const HEAD_DIM: usize = 64;
/// ε of every RMSNorm.
pub const EPS: f32 = 1e-5;
/// RoPE's θ.
pub const THETA: f64 = 500_000.0;
/// Threads per block of every kernel.
pub const BLOCK: u32 = 256;
/// Warps per block.
pub const WARPS: usize = BLOCK as usize / 32;
/// 16-byte vectors a lane loads per row of its chunk.
const V: usize = 8;
/// 16-byte vectors (of 8 weights) per row chunk: a warp's 32 lanes × `V`.
pub const CHUNK: usize = 32 * V;
/// Query heads per key/value head, at most.
pub const MAX_GROUP: usize = 4;
/// 8-lane groups of the attention: a group covers one 64-dimension row in 16-byte vectors.
const GROUPS: usize = BLOCK as usize / 8;
/// Tokens per group per step of the flash-decoding loop (two steps' keys and values in
/// registers: the next step's loads go out before this one's arithmetic).
const TOKENS: usize = 2;
/// Floats per query head of a block's merged attention state: `o` (64), `l`, `m`, padding.
const STATE: usize = HEAD_DIM + 4;
/// Blocks per cluster of the attention, at most (the non-portable limit).
pub const MAX_CLUSTER: usize = 16;
/// A score below any real one (finite, so that 2^(m − m) stays 1).
const NO_SCORE: f32 = -1e30;
/// log2(e) / √64: scores in `exp2` units.
const Q_SCALE: f32 = core::f32::consts::LOG2_E * 0.125;
/// Floats per staged 16-byte input vector: its 8 values and 4 of padding, so that lanes `c`
/// and `c + 1` are 48 bytes apart and a quarter-warp's 16-byte shared loads hit 8 different
/// bank groups.
const STAGE: usize = 12;

const _: () = assert!(V == 8 && TOKENS == 2 && MAX_GROUP == 4 && MAX_CLUSTER == 16 && GROUPS == 4 * WARPS, "the unrolled loops list 8, 2, 4 and 16 indices; 4 groups a warp");

/// 16 bytes (8 bf16 values) as four raw words.
pub(crate) type Vector = [u32; 4];

/// Vector `i` of `input` (bf16), through the coherent path (bounds and alignment checked).
#[inline(always)]
fn load_vector(input: &Out<bf16>, i: usize) -> Vector {
    // SAFETY: as in `words`; the view lives only for this load and no `&[bf16]` to the buffer exists.
    let words = unsafe { Out::<u32>::from_raw_parts(input.as_mut_ptr().cast::<u32>(), input.len() / 2) };
    words.load16::<4>(i)
}

/// Floats `8c .. 8c + 8` of `x`, through the coherent path.
#[inline(always)]
fn load8(x: &impl Coherent<f32>, c: usize) -> [f32; 8] {
    let (lo, hi) = (x.load16::<4>(2 * c), x.load16::<4>(2 * c + 1));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Staged vector `c` (see [`STAGE`]).
#[inline(always)]
fn staged(stage: SharedSlice<f32>, c: usize) -> [f32; 8] {
    let (lo, hi) = (stage.load16::<4>(3 * c), stage.load16::<4>(3 * c + 1));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Stages `vectors` vectors of `x` (f32) from vector `start` on, times `norm_w` when given, in
/// `stage` (see [`STAGE`]); returns this thread's share of `Σ x²`. The caller synchronises
/// the block.
/// `norm_w` comes with its vector `thread::rank_in_block()`, loaded before the PDL wait.
/// Without `norm_w`, a thread loads two vectors half the input apart before storing either,
/// which halves the serial round trips to L2 of a long input (the down projection's 8192
/// values: 2 per thread, not 4).
#[inline(always)]
fn stage_input(x: &impl Coherent<f32>, start: usize, vectors: usize, norm_w: Option<(&[bf16], Vector)>, stage: SharedSlice<f32>) -> f32 {
    let half = if norm_w.is_some() { vectors } else { vectors.div_ceil(2) };
    let mut squares = 0.0f32;
    for first in block::stride_loop(0..half) {
        let second = first + half;
        let values = [load8(x, start + first), if second < vectors { load8(x, start + second) } else { [0.0; 8] }];
        unroll!(k in [0 1] {
            let c = first + k * half;
            if c < vectors {
                let mut v = values[k];
                for &value in &v {
                    squares = value.fma(value, squares);
                }
                if let Some((norm_w, mine)) = norm_w {
                    // SAFETY: `norm_w` is a kernel argument, 256-byte aligned, written by the host alone.
                    let g = widen8::<bf16>(if c == thread::rank_in_block() as usize { mine } else { unsafe { global::load16_invariant::<u32, 4>(words(norm_w), c) } });
                    for j in 0..8 {
                        v[j] *= g[j];
                    }
                }
                stage.store16(3 * c, [v[0], v[1], v[2], v[3]]);
                stage.store16(3 * c + 1, [v[4], v[5], v[6], v[7]]);
            }
        });
    }
    squares
}

/// Bytes of dynamic shared memory that stage an input of `k` values.
pub const fn stage_bytes(k: usize) -> usize {
    k / 8 * STAGE * 4
}

/// Chunks per row of `k` columns, and so warps per pair of rows.
pub const fn chunks(k: usize) -> usize {
    (k / 8).div_ceil(CHUNK)
}

/// Pairs of rows per block of a projection with `k` columns.
pub const fn pairs_per_block(k: usize) -> usize {
    WARPS / chunks(k)
}

/// A warp's weights: vectors `chunk · CHUNK + lane + 32 j` of both rows of its pair.
type Tile = [[Vector; V]; 2];

/// log2 of the chunks per row of `row_vectors` 16-byte vectors (shifts, not divisions: a
/// 64-bit division is a long subroutine, ahead of the first weight load); traps unless the
/// chunks are a power of two that divides the block's warps.
#[inline(always)]
fn chunk_shift(row_vectors: usize) -> u32 {
    let chunks = (row_vectors as u32).div_ceil(CHUNK as u32);
    if !chunks.is_power_of_two() || chunks > WARPS as u32 {
        arch::trap();
    }
    chunks.trailing_zeros()
}

/// Loads this lane's share of `chunk` of rows `rows` of `w` (rows of `row_vectors` vectors):
/// up to 16 loads of 16 bytes, all issued before any is used, bounds checked once for both rows.
#[inline(always)]
fn load_tile(w: &[bf16], rows: (usize, usize), row_vectors: usize, chunk: usize) -> Tile {
    // SAFETY: `w` is a kernel argument, 256-byte aligned.
    let w = unsafe { words(w) };
    global::check16::<u32, 4>(w.as_ptr(), w.len(), (rows.0.max(rows.1) + 1) * row_vectors);
    let first = chunk * CHUNK + warp::lane() as usize;
    let mut tile = [[[0u32; 4]; V]; 2];
    unroll!(j in [0 1 2 3 4 5 6 7] {
        let c = first + 32 * j;
        if c < row_vectors {
            // SAFETY: vectors below `(max row + 1) · row_vectors` are in bounds (checked above),
            // and `c < row_vectors`; weights are written by the host alone.
            unsafe {
                tile[0][j] = global::load16_invariant_unchecked::<u32, 4>(w, rows.0 * row_vectors + c);
                tile[1][j] = global::load16_invariant_unchecked::<u32, 4>(w, rows.1 * row_vectors + c);
            }
        }
    });
    tile
}

/// The tile's two dot products with the staged input, summed over the warp (in every lane).
#[inline(always)]
fn tile_dot(tile: &Tile, stage: SharedSlice<f32>, row_vectors: usize, chunk: usize) -> [f32; 2] {
    let first = chunk * CHUNK + warp::lane() as usize;
    let mut acc = [0.0f32; 2];
    unroll!(j in [0 1 2 3 4 5 6 7] {
        let c = first + 32 * j;
        if c < row_vectors {
            let x = staged(stage, c);
            acc[0] = dot8::<bf16>(tile[0][j], x, acc[0]);
            acc[1] = dot8::<bf16>(tile[1][j], x, acc[1]);
        }
    });
    [warp::reduce_sum(acc[0]), warp::reduce_sum(acc[1])]
}

/// Sums the warps' partial dot products over each pair's chunks (`1 << shift` of them), in
/// chunk order, through `partial`: thread `t < WARPS >> shift` gets `[row a, row b]` of the
/// block's `t`-th pair.
#[inline(always)]
fn combine(sums: [f32; 2], partial: SharedSlice<f32>, shift: u32) -> Option<[f32; 2]> {
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane());
    if lane == 0 {
        partial.store(2 * warp, sums[0]);
        partial.store(2 * warp + 1, sums[1]);
    }
    block::sync();
    let t = thread::rank_in_block() as usize;
    if t >= WARPS >> shift {
        return None;
    }
    let mut s = [0.0f32; 2];
    for k in 0..1usize << shift {
        let at = 2 * ((t << shift) + k);
        s[0] += partial.load(at);
        s[1] += partial.load(at + 1);
    }
    Some(s)
}

/// `norm_w`'s vector `thread::rank_in_block()` (the last one past the end), for
/// [`stage_input`]: a read of the host's data, so it may precede the PDL wait.
#[inline(always)]
fn norm_vector(norm_w: &[bf16]) -> Vector {
    let last = norm_w.len() / 8 - 1;
    // SAFETY: `norm_w` is a kernel argument, 256-byte aligned, written by the host alone.
    unsafe { global::load16_invariant::<u32, 4>(words(norm_w), (thread::rank_in_block() as usize).min(last)) }
}

/// A projection of `x` (elements `x_at` of what `input()` returns, f32, times `norm_w` when
/// given) by `w`, row pairs `rows(p)` for `p < pairs`, in *items* of `WARPS / chunks` pairs (a
/// block's worth), shared round robin from block `first` on ([`grid::round_robin`]), staging `x` once and
/// loading each item's weights right after the previous item's epilogue (no block ends and no
/// new one starts and stages between items; loading them before the epilogue spills: ptxas).
/// The first item's weights, and `early(p)` of its pairs (the host's data an epilogue needs),
/// load before the PDL wait and `input()` (the persistent step's wait for `x`); `late(p,
/// early)` (an output of other blocks it needs) right after them or the previous item's
/// epilogue; then `epilogue(p, [row a, row b], 1/rms(x), late)` in the pair's thread (1/rms
/// is 1 without `norm_w`), and `done(pairs)` in every thread of the block once the item's
/// pairs are written (the persistent step publishes them).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn project<X: Coherent<f32>, E: Copy, L: Copy>(
    input: impl FnOnce() -> X,
    x_at: Range<usize>,
    norm_w: Option<&[bf16]>,
    w: &[bf16],
    pairs: usize,
    rows: impl Fn(usize) -> (usize, usize),
    early: impl Fn(usize) -> E,
    late: impl Fn(usize, E) -> L,
    epilogue: impl Fn(usize, [f32; 2], f32, L),
    done: impl Fn(Range<usize>),
    first: u32,
) {
    let (k, row_vectors) = (x_at.len(), x_at.len() / 8);
    let shift = chunk_shift(row_vectors);
    let per_item = WARPS >> shift;
    // Item indices in 32 bits: fewer registers across the loop (64-bit ones spill).
    let (items, step) = (pairs.div_ceil(per_item) as u32, grid::dim().x);
    let mut item = grid::round_robin(items, first).next().unwrap_or(items);
    if item >= items {
        grid::launch_dependents();
        return;
    }
    let (warp, t) = (warp::index_in_block() as usize, thread::rank_in_block() as usize);
    let chunk = warp & ((1 << shift) - 1);
    // This warp's pair in an item (the last pair past the end), and this thread's output pair.
    let tile_pair = |item: u32| (item as usize * per_item + (warp >> shift)).min(pairs - 1);
    let out_pair = |item: u32| Some(item as usize * per_item + t).filter(|&p| t < per_item && p < pairs);
    let item_pairs = |item: u32| item as usize * per_item..((item as usize + 1) * per_item).min(pairs);
    let mut tile = load_tile(w, rows(tile_pair(item)), row_vectors, chunk);
    grid::launch_dependents();
    let norm_w = norm_w.map(|n| (n, norm_vector(n)));
    let mut early_values = out_pair(item).map(&early);
    grid::wait_for_prerequisites();
    let x = input();
    let mut late_values = out_pair(item).zip(early_values).map(|(p, e)| late(p, e));
    let stage = shared::dynamic().take::<f32>(row_vectors * STAGE);
    let squares = stage_input(&x, x_at.start / 8, row_vectors, norm_w, stage);
    // The reduction's barriers also order the staging before the dot products.
    let rstd = if norm_w.is_some() {
        math::rsqrt(block::reduce_sum(squares, shared!([f32; 32])) / k as f32 + EPS)
    } else {
        block::sync();
        1.0
    };
    // Two buffers of partial sums, alternate items: an item's writes come after the previous
    // item's barrier, which follows every read of the item before.
    let (mut partial, mut other) = (shared!([f32; 2 * WARPS]), shared!([f32; 2 * WARPS]));
    loop {
        let sums = tile_dot(&tile, stage, row_vectors, chunk);
        let combined = combine(sums, partial, shift);
        if let (Some(p), Some(s), Some(l)) = (out_pair(item), combined, late_values) {
            epilogue(p, s, rstd, l);
        }
        done(item_pairs(item));
        (item, partial, other) = (item + step, other, partial);
        if item >= items {
            return;
        }
        tile = load_tile(w, rows(tile_pair(item)), row_vectors, chunk);
        early_values = out_pair(item).map(&early);
        late_values = out_pair(item).zip(early_values).map(|(p, e)| late(p, e));
    }
}

/// `silu(gate) · up`.
#[inline(always)]
pub(crate) fn silu_gate(gate: f32, up: f32) -> f32 {
    gate * math::rcp(1.0 + math::exp(-gate)) * up
}

/// Step kernel 1: `h = embedding[token]`, widened to f32; one block.
#[kernel(launch_bounds(max_threads = 256))]
pub fn llama_embed(embedding: &[bf16], token: &[u32], h: Out<f32>) {
    let hidden = h.len();
    let row = token[0] as usize * hidden;
    grid::launch_dependents();
    // The previous step's LM head reads `h`.
    grid::wait_for_prerequisites();
    for i in block::stride_loop(0..hidden) {
        h.set(i, embedding[row + i].to_f32());
    }
}

/// The QKV projection's pair `p` of rows `(r, r + 32)` of a head (so that RoPE's rotate-half
/// partners meet in one thread): the head's first row, and `r`'s index in the head.
#[inline(always)]
pub(crate) fn head_rows(p: usize) -> (usize, usize) {
    (p / (HEAD_DIM / 2) * HEAD_DIM, p % (HEAD_DIM / 2))
}

/// The rows of the QKV projection's pair `p`.
#[inline(always)]
pub(crate) fn qkv_rows(p: usize) -> (usize, usize) {
    let (base, i) = head_rows(p);
    (base + i, base + i + HEAD_DIM / 2)
}

/// RoPE's cosine and sine for the QKV projection's pair `p` at position `pos` (the table
/// holds, per position, 32 cosines then 32 sines).
#[inline(always)]
pub(crate) fn rope_factors(rope: &[f32], pos: usize, p: usize) -> (f32, f32) {
    let (_, i) = head_rows(p);
    (rope[pos * HEAD_DIM + i], rope[pos * HEAD_DIM + HEAD_DIM / 2 + i])
}

/// The rotate-half pair `(a, b)` rotated by `(cos, sin)`.
#[inline(always)]
pub(crate) fn rotate(a: f32, b: f32, (cos, sin): (f32, f32)) -> (f32, f32) {
    (a.fma(cos, -(b * sin)), b.fma(cos, a * sin))
}

/// Layer kernel 1: `q, k, v = W_qkv · RMSNorm(h)·norm_w`, RoPE on q and k (the table holds,
/// per position, 32 cosines then 32 sines), q to `q` (f32), k and v rounded to bf16 into the
/// caches (`kv heads × max_len × 64`) at `position[0]`. `w_qkv`: q, k, v heads' rows, each
/// `hidden` long. Grid: blocks of 256, at most one per item of [`project`] (`pairs /
/// pairs_per_block(hidden)`), `stage_bytes(hidden)` of dynamic shared memory; the same for the
/// other projections.
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
#[allow(clippy::too_many_arguments)]
pub fn llama_qkv(h: Out<f32>, norm_w: &[bf16], w_qkv: &[bf16], rope: &[f32], position: &[u32], q: Out<f32>, k_cache: Out<bf16>, v_cache: Out<bf16>, max_len: u32) {
    let max_len = max_len as usize;
    let (q_rows, kv_rows) = (q.len(), k_cache.len() / max_len);
    // The position and RoPE factors are the host's: they load before the PDL wait.
    let pos = position[0] as usize;
    let early = |p: usize| rope_factors(rope, pos, p);
    let epilogue = |p: usize, [a, b]: [f32; 2], rstd: f32, factors: (f32, f32)| {
        let (base, i) = head_rows(p);
        let (a, b) = (a * rstd, b * rstd);
        let (lo, hi) = rotate(a, b, factors);
        let cache_row = |kv_base: usize| (kv_base / HEAD_DIM * max_len + pos) * HEAD_DIM + i;
        if base < q_rows {
            q.set(base + i, lo);
            q.set(base + i + HEAD_DIM / 2, hi);
        } else if base < q_rows + kv_rows {
            let row = cache_row(base - q_rows);
            k_cache.set(row, bf16::from_f32(lo));
            k_cache.set(row + HEAD_DIM / 2, bf16::from_f32(hi));
        } else {
            let row = cache_row(base - q_rows - kv_rows);
            v_cache.set(row, bf16::from_f32(a));
            v_cache.set(row + HEAD_DIM / 2, bf16::from_f32(b));
        }
    };
    project(|| &h, 0..h.len(), Some(norm_w), w_qkv, (q_rows + 2 * kv_rows) / 2, qkv_rows, early, |_, e| e, epilogue, |_| (), 0);
}

/// Layer kernels 3 and 5: `h += w · x` (`w`: `h.len() × x.len()`).
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn llama_residual(x: Out<f32>, w: &[bf16], h: Out<f32>) {
    // The residual's loads go out with the staging's (or the previous item's epilogue).
    let late = |p: usize, ()| [h.get(2 * p), h.get(2 * p + 1)];
    project(|| &x, 0..x.len(), None, w, h.len() / 2, |p| (2 * p, 2 * p + 1), |_| (), late, |p, [a, b], _, old: [f32; 2]| {
        h.set(2 * p, old[0] + a);
        h.set(2 * p + 1, old[1] + b);
    }, |_| (), 0);
}

/// Layer kernel 4: `act = silu(gate) · up` with `[gate; up] = w_gate_up · RMSNorm(h)·norm_w`
/// (`w_gate_up`: the gate rows, then the up rows).
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn llama_gate_up(h: Out<f32>, norm_w: &[bf16], w_gate_up: &[bf16], act: Out<f32>) {
    let inter = act.len();
    project(|| &h, 0..h.len(), Some(norm_w), w_gate_up, inter, |p| (p, inter + p), |_| (), |_, ()| (), |p, [gate, up], rstd, ()| {
        act.set(p, silu_gate(gate * rstd, up * rstd));
    }, |_| (), 0);
}

/// The last kernel: `logits = embedding · RMSNorm(h)·norm_w` (`embedding`: `vocab × hidden`,
/// vocab even).
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn llama_lm_head(h: Out<f32>, norm_w: &[bf16], embedding: &[bf16], logits: Out<f32>) {
    project(|| &h, 0..h.len(), Some(norm_w), embedding, logits.len() / 2, |p| (2 * p, 2 * p + 1), |_| (), |_, ()| (), |p, [a, b], rstd, ()| {
        logits.set(2 * p, a * rstd);
        logits.set(2 * p + 1, b * rstd);
    }, |_| (), 0);
}

/// One query head's online softmax over the tokens a group has seen: the largest score `m`,
/// `l = Σ 2^(s − m)`, and `o = Σ 2^(s − m)·v` for the lane's 8 dimensions.
#[derive(Clone, Copy)]
struct Softmax {
    m: f32,
    l: f32,
    o: [f32; 8],
}

impl Softmax {
    const EMPTY: Self = Self { m: NO_SCORE, l: 0.0, o: [0.0; 8] };
}

/// The lane's vectors of a group's `TOKENS` tokens' keys and values.
type Rows = ([Vector; TOKENS], [Vector; TOKENS]);

/// Layer kernel 2: attention of each query head over its KV head's cached tokens
/// `0 ..= position[0]` (the last one just appended), written to `attn` (f32, head-major).
/// Caches: `kv heads × max_len × 64`; `q`: `heads × 64`, `heads / kv heads ≤ 4`. Grid `kv
/// heads × C` blocks of 256, clusters of `C`: block `r` of a cluster attends to the `r`-th
/// `1/C` of tokens `0 .. position`, 32 groups of 8 lanes, `TOKENS` tokens per group in flight.
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn llama_attention(q: Out<f32>, k_cache: Out<bf16>, v_cache: Out<bf16>, position: &[u32], attn: Out<f32>, max_len: u32) {
    let max_len = max_len as usize;
    let kv_heads = k_cache.len() / (max_len * HEAD_DIM);
    let group_size = q.len() / HEAD_DIM / kv_heads;
    let kv_head = cluster::index_in_grid().x as usize;
    let pos = position[0] as usize;
    let first = kv_head * group_size * HEAD_DIM;
    let ready = || {
        grid::launch_dependents();
        grid::wait_for_prerequisites();
        // The QKV kernel appended the new token to the caches.
        let new_token = |lane8| {
            let at = cache_vector(kv_head, max_len, pos, lane8);
            (load_vector(&k_cache, at), load_vector(&v_cache, at))
        };
        (&q, first, new_token)
    };
    attend(&k_cache, &v_cache, kv_head, max_len, pos, group_size, ready, |i, value| attn.set(first + i, value));
}

/// Vector `lane8` (dimensions `8·lane8 ..`) of token `tok` of cache head `head` (caches of
/// heads × `max_len` × 64).
#[inline(always)]
pub(crate) fn cache_vector(head: usize, max_len: usize, tok: usize, lane8: usize) -> usize {
    (head * max_len + tok) * (HEAD_DIM / 8) + lane8
}

/// The attention of the `group_size` query heads of cache head `cache_head` (the cluster's
/// blocks splitting its tokens `0 .. pos`) to the tokens and the new one, `pos`: what
/// [`fn@llama_attention`] and the persistent step's attention tasks run. The first cached
/// tokens' loads go out before `ready()`, which waits for the rest and returns the group's
/// query heads (`q` from element `first` on) and the new token's key and value vector
/// `lane8`; rank 0 writes the output, element `h·64 + d` of the group's heads, with `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend<Q: Coherent<f32>, N: Fn(usize) -> (Vector, Vector)>(
    k_cache: &Out<bf16>,
    v_cache: &Out<bf16>,
    cache_head: usize,
    max_len: usize,
    pos: usize,
    group_size: usize,
    ready: impl FnOnce() -> (Q, usize, N),
    out: impl Fn(usize, f32),
) {
    if group_size == 0 || group_size > MAX_GROUP || cluster::size() as usize > MAX_CLUSTER {
        arch::trap();
    }
    let (rank, blocks) = (cluster::block_rank() as usize, cluster::size() as usize);
    let t = thread::rank_in_block() as usize;
    let (group, lane8) = (t / 8, t % 8);
    // Tokens `0 .. pos` are in the cache before this step (the step writes token `pos`
    // only), so their first loads go out before the wait.
    let (start, end) = (pos * rank / blocks, pos * (rank + 1) / blocks);
    let vector = |tok: usize| cache_vector(cache_head, max_len, tok, lane8);
    let load = |base: usize| -> Rows {
        let mut rows = ([[0u32; 4]; TOKENS], [[0u32; 4]; TOKENS]);
        unroll!(u in [0 1] {
            // Past `end`, the last token again (ignored by the caller).
            let tok = (base + group + GROUPS * u).min(end - 1);
            rows.0[u] = load_vector(k_cache, vector(tok));
            rows.1[u] = load_vector(v_cache, vector(tok));
        });
        rows
    };
    let mut rows = if start < end { load(start) } else { ([[0; 4]; TOKENS], [[0; 4]; TOKENS]) };
    let (q, first, new_token) = ready();

    // The group's query heads, scaled, in shared memory (registers hold keys and values).
    let qs = shared!([f32; MAX_GROUP * HEAD_DIM]);
    if t < group_size * HEAD_DIM / 4 {
        qs.store16(t, q.load16::<4>(first / 4 + t).map(|v| v * Q_SCALE));
    }
    block::sync();
    let query = |h: usize| -> [f32; 8] {
        let (lo, hi) = (qs.load16::<4>(h * HEAD_DIM / 4 + 2 * lane8), qs.load16::<4>(h * HEAD_DIM / 4 + 2 * lane8 + 1));
        [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
    };
    let mut states = [Softmax::EMPTY; MAX_GROUP];
    if rank == 0 && t < 32 {
        // The whole warp shuffles; its first group keeps the result.
        let (k_new, v_new) = new_token(lane8);
        unroll!(h in [0 1 2 3] {
            if h < group_size {
                let score = warp::group_sum::<8, f32>(dot8::<bf16>(k_new, query(h), 0.0));
                if group == 0 {
                    states[h] = Softmax { m: score, l: 1.0, o: widen8::<bf16>(v_new) };
                }
            }
        });
    }
    let mut base = start;
    while base < end {
        let (ks, vs) = rows;
        let next = base + GROUPS * TOKENS;
        if next < end {
            rows = load(next);
        }
        unroll!(h in [0 1 2 3] {
            if h < group_size {
                let (state, q) = (&mut states[h], query(h));
                let mut s = [NO_SCORE; TOKENS];
                let mut m = state.m;
                unroll!(u in [0 1] {
                    let score = warp::group_sum::<8, f32>(dot8::<bf16>(ks[u], q, 0.0));
                    if base + group + GROUPS * u < end {
                        s[u] = score;
                        m = m.max(score);
                    }
                });
                let rescale = math::exp2(state.m - m);
                state.l *= rescale;
                for o in state.o.iter_mut() {
                    *o *= rescale;
                }
                unroll!(u in [0 1] {
                    let p = if base + group + GROUPS * u < end { math::exp2(s[u] - m) } else { 0.0 };
                    state.l += p;
                    for (o, &v) in state.o.iter_mut().zip(&widen8::<bf16>(vs[u])) {
                        *o = p.fma(v, *o);
                    }
                });
                state.m = m;
            }
        });
        base = next;
    }

    // Merge the 4 groups of each warp through shuffles (lanes 8g .. 8g + 8 hold group g's
    // dimensions; after the two rounds lanes 0 .. 8 hold the warp's state), then the block's
    // warps through shared memory (in warp order), then the cluster's blocks (in rank order).
    unroll!(h in [0 1 2 3] {
        if h < group_size {
            for mask in [8, 16] {
                let state = &mut states[h];
                let (m_other, l_other) = (warp::shuffle_xor(state.m, mask), warp::shuffle_xor(state.l, mask));
                let m = state.m.max(m_other);
                let (mine, theirs) = (math::exp2(state.m - m), math::exp2(m_other - m));
                state.l = state.l.fma(mine, l_other * theirs);
                for o in state.o.iter_mut() {
                    let other = warp::shuffle_xor(*o, mask);
                    *o = o.fma(mine, other * theirs);
                }
                state.m = m;
            }
        }
    });
    let parts = shared!([f32; WARPS * MAX_GROUP * HEAD_DIM]);
    let (ms, ls) = (shared!([f32; WARPS * MAX_GROUP]), shared!([f32; WARPS * MAX_GROUP]));
    let warp = warp::index_in_block() as usize;
    if group == warp * 4 {
        unroll!(h in [0 1 2 3] {
            if h < group_size {
                let o = states[h].o;
                let at = ((warp * MAX_GROUP + h) * HEAD_DIM) / 4 + 2 * lane8;
                parts.store16(at, [o[0], o[1], o[2], o[3]]);
                parts.store16(at + 1, [o[4], o[5], o[6], o[7]]);
                if lane8 == 0 {
                    ms.store(warp * MAX_GROUP + h, states[h].m);
                    ls.store(warp * MAX_GROUP + h, states[h].l);
                }
            }
        });
    }
    block::sync();
    // `merged`: per query head, the block's `o` (64), `l` and largest score `m`, `o` and `l`
    // relative to `m`. One element of `o` per thread (a single pass when `group_size · 64 ≤
    // 256`), each warp's maximum loaded before any is used; every thread forms its head's `l`
    // too (broadcast loads), that of dimension 0 stores it and `m`.
    let merged = shared!([f32; MAX_GROUP * STATE]);
    for i in block::stride_loop(0..group_size * HEAD_DIM) {
        let (h, d) = (i / HEAD_DIM, i % HEAD_DIM);
        let maxima: [f32; WARPS] = core::array::from_fn(|w| ms.load(w * MAX_GROUP + h));
        let largest = maxima.iter().fold(NO_SCORE, |a, &b| a.max(b));
        let (mut o, mut l) = (0.0f32, 0.0f32);
        for (w, &m) in maxima.iter().enumerate() {
            let weight = math::exp2(m - largest);
            o = weight.fma(parts.load((w * MAX_GROUP + h) * HEAD_DIM + d), o);
            l = weight.fma(ls.load(w * MAX_GROUP + h), l);
        }
        merged.store(h * STATE + d, o);
        if d == 0 {
            merged.store(h * STATE + HEAD_DIM, l);
            merged.store(h * STATE + HEAD_DIM + 1, largest);
        }
    }
    // One cluster barrier publishes every block's state; rank 0 reads them all through DSMEM
    // (in rank order; every block's loads issued before any is used) and writes the result; the
    // trailing barrier keeps the peers resident until it has.
    cluster::sync();
    if rank == 0 {
        for i in block::stride_loop(0..group_size * HEAD_DIM) {
            let (h, d) = (i / HEAD_DIM, i % HEAD_DIM);
            let mut peers = [[0.0f32, 0.0, NO_SCORE]; MAX_CLUSTER];
            unroll!(r in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15] {
                if r < blocks {
                    let state = merged.in_block(r as u32);
                    peers[r] = [state.load(h * STATE + d), state.load(h * STATE + HEAD_DIM), state.load(h * STATE + HEAD_DIM + 1)];
                }
            });
            let largest = peers.iter().fold(NO_SCORE, |a, p| a.max(p[2]));
            let (mut o, mut l) = (0.0f32, 0.0f32);
            for [o_r, l_r, m_r] in peers {
                let weight = math::exp2(m_r - largest);
                o = weight.fma(o_r, o);
                l = weight.fma(l_r, l);
            }
            out(h * HEAD_DIM + d, o / l);
        }
    }
    cluster::sync();
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
