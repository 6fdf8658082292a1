//! The decode step of a Llama attention block: RMSNorm → QKV projection → RoPE → append
//! K/V to the cache → attention over the cache → output projection + residual, for a batch of
//! 1-8 tokens of different sequences (each with its own cache and position), f16 or bf16
//! weights and caches, f32 arithmetic, after ClusterFusion.
//!
//! **Fused**: two launches, as many as the dataflow needs — everything up to a head's
//! attention output depends on that head alone, while the output projection sums over all
//! heads.
//!
//! [`fn@decode_attention_f16`] (and its bf16 and batch-8 twins): one cluster of `C` blocks per
//! head (grid `heads × C`, `C` chosen at launch). Each block
//! 1. issues its first loads of `W_qkv` before anything else;
//! 2. stages `x ⊙ norm_w` for its `1/C` of the columns in shared memory and sums `x²` over
//!    the whole row — RMSNorm's `1/rms` is a per-token scalar, applied after the projection,
//!    so the weights stream from the first instruction;
//! 3. multiplies those columns with the head's 384 rows of `W_qkv` (split-K: a warp per 4
//!    rows × 4 16-byte vectors per lane, at batch tile 8 2 rows × 4, the next item's loads
//!    issued before the warp reductions) and `cluster::reduce` sums the blocks' partial q, k,
//!    v in rank order. Register loads, not a ring of bulk copies (`cp.async.bulk`): with one
//!    (102 KB of dynamic shared memory) this kernel ran at half the speed on the H200, its
//!    cache phase included (the L1 the ring takes, or its per-warp serialisation), and the
//!    output projection took 14.4 µs alone (`ncu`) with a ring of 2 items a warp, 12.5 µs
//!    with register loads;
//! 4. scales by `1/rms`, rotates q and k (RoPE, Hugging Face's rotate-half), rounds k and v
//!    to the cache's type; rank 0 appends them to the cache;
//! 5. runs flash-decoding over its `1/C` of each sequence's cached tokens: 16-lane groups, 8
//!    tokens per group in flight, an online softmax in `exp2` units (rank 0's group 0 starts
//!    from the new token, held in shared memory), merged over the block's groups in group
//!    order and over the cluster in rank order (`cluster::reduce` with `Max`, then `Sum`);
//! 6. rank 0 writes the head's attention output (f32) to `attn`.
//!
//! [`fn@decode_o_proj_f16`] (and twins): `out = x + W_o · attn`, spread over the whole GPU — a
//! warp per 2 rows (4 at batch 8), 4 16-byte vectors of each per lane per item (2 at batch
//! 8), the next item's loads issued before the current one is used ([`dot_rows`], shared
//! with spread 1/3); each block issues its first item, waits for the attention kernel, then
//! stages all heads' `attn` in shared memory. No atomics anywhere: the output is
//! deterministic.
//!
//! **Programmatic dependent launch** (optional, `fused(.., programmatic: true)`): fused 2/2
//! is launched with `LaunchConfig::programmatic`; fused 1/2 calls `grid::launch_dependents`
//! once its `W_qkv` stream is done (before the cluster reduction), so fused 2/2's blocks may
//! start on the SMs' free slots and put their first `W_o` item in flight while the
//! attention runs; they call `grid::wait_for_prerequisites` before
//! reading `attn`. Launched in stream order, the wait returns at once.
//!
//! **Persistent** ([`fn@decode_block_persistent_f16`] and bf16, batch 1): both stages in one
//! `#[kernel(persistent)]` launch, `attn` a [`Published`] buffer in tiles of a head. The
//! grid's clusters take heads round robin and run fused 1/2's stage; rank 0 publishes its
//! head's output. Every block then takes items of the output projection (32 rows each, so
//! that one wave of blocks holds them all) round robin, starting from the first block past
//! the heads' clusters: blocks with no head issue their first `W_o` loads at once, before
//! they wait for all heads' outputs, as fused 2/2's blocks do under PDL — but with no
//! second launch, and no grid boundary between the heads' tail and the projection.
//!
//! Sizing at hidden 4096, clusters of 4 (`ptxas -v`, `attention_config`, `o_proj_config`):
//! fused 1/2 uses 128 registers (`min_blocks = 2`), 25 KB of static and 6 KB of dynamic
//! shared memory (the staged activations), so two blocks fit on an SM and all 32 clusters
//! should be resident at once (`decode-bench` prints `max_active_clusters`): 128 blocks of
//! 256 threads, one wave, each keeping 16 16-byte loads per thread (64 KB) in flight in the
//! projection and in the attention (8 tokens' K and V per group). Fused 2/2 uses 106
//! registers and 24 KB of dynamic shared memory (the staged `attn`): 256 blocks, two per
//! SM, one wave; one fits beside a block of fused 1/2 (55 KB and 59K registers together, of
//! 227 KB and 64K), for PDL.
//!
//! Kernels take the batch tile as a constant: the `_b8` kernels run batches 2-8 (rows past
//! the batch are zeros and not written), the others batch 1. At tile 8 the projection keeps 8
//! loads per thread in flight (its 2 × 8 accumulators take the registers of the other 8; 128
//! registers, 16 bytes spilled outside the loops) and takes 34 KB of dynamic shared memory;
//! the output projection runs 128 blocks of 4 rows a warp, one per SM (176 registers, 136 KB
//! of staged `attn`), so it does not fit beside a block of fused 1/2 and under PDL starts
//! only on SMs without one. Staged activations are padded so
//! that the lanes' 16-byte shared loads are free of bank conflicts (see `staged`).
//!
//! **Spread** (three launches, batch 1, f16 or bf16; `spread(..)`): the fused 1/2 kernel
//! streams the 100 MB of `W_qkv` from one block per SM (32 clusters of 4: 8 warps an SM), so
//! [`fn@decode_qkv_rope_f16`] moves the projection onto the whole GPU, as the output projection
//! is, and leaves the clusters only the attention:
//! 1. [`fn@decode_qkv_rope_f16`] (and bf16): a warp per pair of whole rows `i`, `i + 64` of one
//!    head's q, k or v at a time (no split-K: a row is 8 KB; the pair is RoPE's), 3 pairs a
//!    warp, 8 warps a block, grid `3·hidden / 48` (256 blocks: one wave of two per SM). Each
//!    warp issues its first item of `W_qkv` (2 rows × 4 16-byte vectors per lane) before
//!    anything else, calls `grid::launch_dependents`, stages `x ⊙ norm_w` and reduces `Σ x²`
//!    (each block recomputes `1/rms` of the 8 KB `x`, from L2, once for its 24 pairs), then
//!    issues each next item before using the current one, from one pair into the next (12
//!    items a warp); after each pair, lane 0
//!    scales by `1/rms`, applies RoPE and writes q (f32) to a buffer, k and v (rounded) to
//!    the caches.
//! 2. [`fn@decode_attend_appended_f16`] (and bf16): a cluster per head, launched
//!    programmatically: each block issues its first loads of the cached tokens `0 .. pos`
//!    (spread 1/3 writes only token `pos`), calls `grid::launch_dependents` so that the
//!    output projection may start streaming `W_o`, waits for spread 1/3
//!    (`grid::wait_for_prerequisites`), reads q and the new k, v, then runs fused 1/2's steps
//!    5-6 (flash-decoding, block and cluster merge in rank order).
//! 3. [`fn@decode_o_proj_f16`] as in the fused variant.
//!
//! `ptxas -v` at hidden 4096: spread 1/3 uses 127 registers (`min_blocks = 2`; at 3, 80
//! registers and spills) and 24 KB of dynamic shared memory, so two blocks (16 warps, up to
//! 16 16-byte loads per thread: 128 KB) are in flight on an SM; spread 2/3 uses 125 registers and 9 KB of static shared memory.
//!
//! **Separate** (five launches, f16, batch 1, f32 intermediates in global memory, as a
//! framework would): [`fn@decode_rms_norm`], [`fn@decode_qkv`], [`fn@decode_rope_append`],
//! [`fn@decode_attend`] (the same flash-decoding and cluster merge) and [`fn@decode_o_proj_f16`].
//!
//! On the host ([`host`]):
//!
//! ```no_run
//! # fn main() -> clusterfuse::host::Result<()> {
//! use clusterfuse::f16;
//! use clusterfuse::host::Gpu;
//! use clusterfuse_kernels::decode::host::{fused, persistent_config, Buffers, DecodeType, Step};
//!
//! let gpu = Gpu::new(0)?;
//! // Random weights and a 1024-token cache (seed, hidden, cache length, each sequence's position).
//! let step = Step::<f16>::random(1, 4096, 1024, &[1023]);
//! let kernels = <f16 as DecodeType>::load(&gpu)?;
//! let mut buffers = Buffers::upload(&gpu, &step)?;
//! fused(&kernels, gpu.stream(), &mut buffers, 4, true)?; // two launches: clusters of 4, PDL
//! let config = persistent_config::<f16>(&kernels, &gpu, 4096, 4)?;
//! f16::persistent(&kernels, gpu.stream(), &mut buffers, &config)?; // one launch
//! let out = buffers.results(&gpu, &step)?; // `out`, then the appended k and v
//! # let _ = (out, step.reference()); Ok(()) }
//! ```

use clusterfuse::arch;
use clusterfuse::global::Coherent;
use clusterfuse::packed::{dot8, widen8, words, Packed};
use clusterfuse::prelude::*;

/// Dimensions per head.
pub const HEAD_DIM: usize = 128;
/// Threads per block of every kernel but [`fn@decode_rope_append`].
pub const BLOCK: u32 = 256;
/// ε of the RMSNorm.
pub const EPS: f32 = 1e-5;
/// RoPE's θ.
pub const THETA: f64 = 10000.0;
/// The largest batch (tokens of different sequences in one step).
pub const MAX_BATCH: usize = 8;
/// A head's rows of `W_qkv`: q, k, v.
const QKV: usize = 3 * HEAD_DIM;

const WARPS: usize = BLOCK as usize / 32;
/// 16-lane groups: a group covers one 128-dimension row (K or V) in 16-byte vectors.
const GROUPS: usize = BLOCK as usize / 16;
/// W_qkv rows per warp of the separate GEMV.
const QKV_ROWS: usize = 4;
/// Rows per warp and 16-byte vectors per lane per row of an item of the fused projection, at
/// batch 1 and at batch tile 8 (where the 2 × 8 accumulators take the registers of the other
/// half of the loads).
const QKV_ITEM: [(usize, usize); 2] = [(4, 4), (2, 4)];
/// 16-byte vectors per lane per row of an item of the output projection, at batch 1 and at
/// batch tile 8 (4 KB items with [`O_ROWS`]).
const O_VECTORS: [usize; 2] = [4, 2];
/// Tokens per group per step of the flash-decoding loop.
const TOKENS: usize = 8;
/// Floats per sequence of a block's merged attention state: `o` (128), `l`, and padding to
/// 16 bytes.
const STATE: usize = HEAD_DIM + 4;
/// A score below any real one (finite, so that 2^(m − m) stays 1).
const NO_SCORE: f32 = -1e30;
/// log2(e) / √128: scores in `exp2` units.
const Q_SCALE: f32 = core::f32::consts::LOG2_E * 0.088_388_35;
const _: () = assert!(HEAD_DIM.is_multiple_of(QKV_ITEM[0].0) && HEAD_DIM.is_multiple_of(QKV_ITEM[1].0), "an item's rows stay inside one of q, k, v");
const _: () = assert!(
    QKV_ITEM[0].0 <= 4 && QKV_ITEM[0].1 <= 4 && QKV_ITEM[1].0 <= 4 && QKV_ITEM[1].1 <= 4 && O_VECTORS[0] <= 4 && O_VECTORS[1] <= 4 && TOKENS == 8 && MAX_BATCH == 8,
    "the unrolled loops list 4, 4, 4, 8 and 8 indices"
);

/// Vector `i` (16 bytes: 8 halves) of `input` as four raw words. Loaded as `[T; 8]`, a vector
/// would hold a register per half until it is used; as words it holds four, which is what
/// lets 16 loads per thread be in flight within 128 registers. [`widen8`] converts at use.
#[inline(always)]
fn load_words<T: HalfFloat>(input: &[T], i: usize) -> [u32; 4] {
    // SAFETY: kernel arguments start 256-byte aligned.
    global::load16::<u32, 4>(unsafe { words(input) }, i)
}

/// [`load_words`] from an output, through the coherent path (the caches, which this kernel
/// also writes).
#[inline(always)]
pub(crate) fn load_words_out<T: HalfFloat>(output: &Out<T>, i: usize) -> [u32; 4] {
    const { assert!(core::mem::size_of::<T>() == 2, "16-bit elements") };
    // SAFETY: as in `load_words`; the view lives only for this load and no `&[T]` to the
    // buffer exists.
    let words = unsafe { Out::<u32>::from_raw_parts(output.as_mut_ptr().cast::<u32>(), output.len() / 2) };
    words.load16::<4>(i)
}

/// `acc + Σ w[k]·x[k]`, in f32.
#[inline(always)]
fn dot8_f16(w: [f16; 8], x: [f32; 8], acc: f32) -> f32 {
    let mut acc = acc;
    for k in 0..8 {
        acc = w[k].to_f32().fma(x[k], acc);
    }
    acc
}

/// Floats `4·q .. 4·q + 8` of `s` (from 16-byte unit `q`), in two 16-byte loads.
#[inline(always)]
fn load8(s: SharedSlice<f32>, q: usize) -> [f32; 8] {
    let (lo, hi) = (s.load16::<4>(q), s.load16::<4>(q + 1));
    [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]]
}

/// Stores `v` at floats `4·q .. 4·q + 8` of `s`.
#[inline(always)]
fn store8(s: SharedSlice<f32>, q: usize, v: [f32; 8]) {
    s.store16(q, [v[0], v[1], v[2], v[3]]);
    s.store16(q + 1, [v[4], v[5], v[6], v[7]]);
}

/// 16-byte units per staged vector position: `B` tokens' 8 floats, then one unit of padding.
const fn stage_units(b: usize) -> usize {
    2 * b + 1
}

/// Where a tile of `B` tokens' activations is staged in shared memory: vector `c` (8 floats)
/// of token `s` at 16-byte unit `c·(2B + 1) + 2s`. A lane's `B` vectors sit together (one
/// base, constant offsets), and lanes `c` and `c + 1` are an odd number of units apart, so
/// the 8 lanes of each phase of a 16-byte shared load hit 8 different bank groups (without
/// the pad, at `B = 8`, lanes 256 bytes apart all hit the same 4 banks: 8-way conflicts).
#[inline(always)]
fn staged<const B: usize>(c: usize, s: usize) -> usize {
    c * stage_units(B) + 2 * s
}

/// `acc[u][s] += w[u][j] · x_s` for every row `u < R` of this thread's loaded weights and
/// every token `s < B`, `x_s` being staged vector `c` of token `s` (see [`staged`]). Called
/// with a constant `j` from an unrolled loop, so every register array index is a constant.
#[inline(always)]
fn accumulate<T: Packed, const B: usize, const R: usize, const V: usize>(
    acc: &mut [[f32; B]; R],
    w: &[[[u32; 4]; V]; R],
    j: usize,
    stage: SharedSlice<f32>,
    c: usize,
) {
    unroll!(s in [0 1 2 3 4 5 6 7] {
        if s < B {
            let xs = load8(stage, staged::<B>(c, s));
            unroll!(u in [0 1 2 3] {
                if u < R {
                    acc[u][s] = dot8::<T>(w[u][j], xs, acc[u][s]);
                }
            });
        }
    });
}

/// A warp's item of `R` rows: this lane's `V` 16-byte vectors of each, as raw words.
type Item<const R: usize, const V: usize> = [[[u32; 4]; V]; R];

/// Item `k` of `R` runs of `len` 16-byte vectors of `w`, run `u` from vector `starts[u]`
/// (a row, or a block's columns of one): this lane's vectors `32·V·k + 32·j + lane`, `j < V`,
/// of each run; past a run's end, its last vector (a load without a branch, which the caller
/// skips).
#[inline(always)]
fn load_item<T: Packed, const R: usize, const V: usize>(w: &[T], starts: [usize; R], len: usize, k: usize) -> Item<R, V> {
    let lane = warp::lane() as usize;
    let mut item = [[[0u32; 4]; V]; R];
    unroll!(u in [0 1 2 3] {
        unroll!(j in [0 1 2 3] {
            if u < R && j < V {
                // SAFETY: as in `load_words`; weights are written by the host alone.
                item[u][j] = unsafe { global::load16_invariant::<u32, 4>(words(w), starts[u] + (32 * V * k + 32 * j + lane).min(len - 1)) };
            }
        });
    });
    item
}

/// The starts of rows `rows` of `row_vectors` vectors, for [`load_item`].
#[inline(always)]
fn row_starts<const R: usize>(rows: [usize; R], row_vectors: usize) -> [usize; R] {
    rows.map(|row| row * row_vectors)
}

/// This lane's share of `W[row] · x_s` for each of `rows` and each token `s < B` of the
/// activations staged in `stage` (see [`staged`]), not yet summed over the warp. `first` is
/// item 0 (see [`load_item`]), which the caller loads before staging the activations; each
/// next item is loaded before the current one is used, so a warp keeps two in flight. With
/// `then`, the last step loads item 0 of rows `then` instead, returned for the caller's next
/// call.
#[inline(always)]
fn dot_rows<T: Packed, const B: usize, const R: usize, const V: usize>(
    w: &[T],
    rows: [usize; R],
    row_vectors: usize,
    stage: SharedSlice<f32>,
    first: Item<R, V>,
    then: Option<[usize; R]>,
) -> ([[f32; B]; R], Item<R, V>) {
    let lane = warp::lane() as usize;
    let mut acc = [[0.0f32; B]; R];
    let mut item = first;
    let steps = row_vectors.div_ceil(32 * V);
    for k in 0..steps {
        let next = match (k + 1 < steps, then) {
            (true, _) => load_item::<T, R, V>(w, row_starts(rows, row_vectors), row_vectors, k + 1),
            (false, Some(rows)) => load_item::<T, R, V>(w, row_starts(rows, row_vectors), row_vectors, 0),
            (false, None) => item,
        };
        unroll!(j in [0 1 2 3] {
            let c = 32 * V * k + 32 * j + lane;
            if j < V && c < row_vectors {
                accumulate::<T, B, R, V>(&mut acc, &item, j, stage, c);
            }
        });
        item = next;
    }
    (acc, item)
}

/// 1/√(mean(x²) + ε) over the whole vector, in every thread.
#[inline(always)]
fn rms_scale(x: &[f16], scratch: SharedSlice<f32>) -> f32 {
    let mut squares = 0.0f32;
    for i in block::stride_loop(0..x.len() / 8) {
        for v in global::load16::<f16, 8>(x, i) {
            let f = v.to_f32();
            squares = f.fma(f, squares);
        }
    }
    math::rsqrt(block::reduce_sum(squares, scratch) / x.len() as f32 + EPS)
}

/// RoPE (rotate-half) of the pair `(x[i], x[i + 64])` with `rope = [cos; 64] ++ [sin; 64]`.
#[inline(always)]
fn rotate(a: f32, b: f32, i: usize, rope: &[f32]) -> (f32, f32) {
    let (cos, sin) = (rope[i], rope[64 + i]);
    (a.fma(cos, -(b * sin)), b.fma(cos, a * sin))
}

/// One 16-lane group's online softmax over the tokens it has seen: the largest score `m`,
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

/// One row (16 bytes, a [`load_words`] vector) of each of a group's `TOKENS` tokens.
type Rows = [[u32; 4]; TOKENS];

/// Rows `row(t)` of the tokens `t = first + GROUPS·u`; past `end` the last row before it
/// (or row 0), loaded unconditionally — a masked load would keep every half in a register
/// of its own — and ignored by the caller.
#[inline(always)]
fn load_rows(first: u32, end: u32, row: &impl Fn(u32) -> [u32; 4]) -> Rows {
    let last = end.saturating_sub(1);
    let mut rows = [[0; 4]; TOKENS];
    unroll!(u in [0 1 2 3 4 5 6 7] {
        rows[u] = row((first + (GROUPS * u) as u32).min(last));
    });
    rows
}

/// [`attend`]'s first keys and values: the caller's group's tokens from `start`.
#[inline(always)]
fn first_rows(start: u32, end: u32, key: &impl Fn(u32) -> [u32; 4], value: &impl Fn(u32) -> [u32; 4]) -> (Rows, Rows) {
    let first = start + thread::rank_in_block() / 16;
    (load_rows(first, end, key), load_rows(first, end, value))
}

/// Folds tokens `start .. end` into `state`, starting from `first` ([`first_rows`]): group `g` takes tokens `base + g + GROUPS·u`,
/// `TOKENS` at a time; the next step's keys are loaded while this step's values are
/// weighed, its values right after. `key(t)` and `value(t)` are the lane's 16 bytes of token
/// `t`'s rows; `q` is pre-scaled by `Q_SCALE`. `start` and `end` are the same in the block.
#[inline(always)]
fn attend<T: Packed>(state: &mut Softmax, q: [f32; 8], start: u32, end: u32, first: (Rows, Rows), key: impl Fn(u32) -> [u32; 4], value: impl Fn(u32) -> [u32; 4]) {
    let group = thread::rank_in_block() / 16;
    let mut base = start;
    let (mut ks, mut vs) = first;
    while base < end {
        let mut s = [NO_SCORE; TOKENS];
        let mut m = state.m;
        unroll!(u in [0 1 2 3 4 5 6 7] {
            let score = warp::group_sum::<16, f32>(dot8::<T>(ks[u], q, 0.0));
            if (base + group + (GROUPS * u) as u32) < end {
                s[u] = score;
                m = m.max(score);
            }
        });
        let next = base + (GROUPS * TOKENS) as u32;
        if next < end {
            ks = load_rows(next + group, end, &key);
        }
        let rescale = math::exp2(state.m - m);
        state.l *= rescale;
        for o in state.o.iter_mut() {
            *o *= rescale;
        }
        unroll!(u in [0 1 2 3 4 5 6 7] {
            let p = if (base + group + (GROUPS * u) as u32) < end { math::exp2(s[u] - m) } else { 0.0 };
            state.l += p;
            for (o, v) in state.o.iter_mut().zip(&widen8::<T>(vs[u])) {
                *o = p.fma(*v, *o);
            }
        });
        state.m = m;
        if next < end {
            vs = load_rows(next + group, end, &value);
        }
        base = next;
    }
}

/// Merges every group's `state` over the block, in group order: `merged[d] = Σ 2^(s − m)·v_d`
/// for `d < 128`, `merged[128] = Σ 2^(s − m)`, zeros after; `maximum[0] = m`, the block's
/// largest score. Every thread of the block calls it.
#[inline(always)]
fn merge_block(state: Softmax, merged: SharedSlice<f32>, maximum: SharedSlice<f32>) {
    let groups = shared!([f32; GROUPS * (HEAD_DIM + 2)]);
    let t = thread::rank_in_block() as usize;
    let (group, lane) = (t / 16, t % 16);
    for k in 0..8 {
        groups.store(group * HEAD_DIM + lane * 8 + k, state.o[k]);
    }
    let (ms, ls) = (groups.slice(GROUPS * HEAD_DIM, GROUPS), groups.slice(GROUPS * (HEAD_DIM + 1), GROUPS));
    if lane == 0 {
        ms.store(group, state.m);
        ls.store(group, state.l);
    }
    block::sync();
    let mut block_max = NO_SCORE;
    for g in 0..GROUPS {
        block_max = block_max.max(ms.load(g));
    }
    let (mut sum, mut l) = (0.0f32, 0.0f32);
    for g in 0..GROUPS {
        let weight = math::exp2(ms.load(g) - block_max);
        l = weight.fma(ls.load(g), l);
        if t < HEAD_DIM {
            sum = weight.fma(groups.load(g * HEAD_DIM + t), sum);
        }
    }
    if t < HEAD_DIM {
        merged.store(t, sum);
    } else if t < STATE {
        merged.store(t, if t == HEAD_DIM { l } else { 0.0 });
    } else if t == STATE {
        maximum.store(0, block_max);
    }
    // `groups` is written again by the next call.
    block::sync();
}

/// Merges the blocks' `states` (`batch` sequences of [`STATE`] floats, from [`merge_block`],
/// with their maxima in `maxima`) over the cluster, in rank order: afterwards every block
/// holds the cluster's sums, relative to the cluster's largest score per sequence.
#[inline(always)]
fn merge_cluster(states: SharedSlice<f32>, maxima: SharedSlice<f32>, batch: usize) {
    let largest = shared!([f32; MAX_BATCH]);
    let t = thread::rank_in_block() as usize;
    if t < MAX_BATCH {
        largest.store(t, if t < batch { maxima.load(t) } else { NO_SCORE });
    }
    cluster::reduce(largest, Max);
    for i in block::stride_loop(0..batch * STATE) {
        let s = i / STATE;
        states.store(i, states.load(i) * math::exp2(maxima.load(s) - largest.load(s)));
    }
    cluster::reduce(states.slice(0, batch * STATE), Sum);
}

/// Row of `W_qkv` that is row `r` (`0 .. 384`: q, k, v) of head `head`.
#[inline(always)]
fn qkv_row(r: usize, head: usize, hidden: usize) -> usize {
    r / HEAD_DIM * hidden + head * HEAD_DIM + r % HEAD_DIM
}

/// The fused kernel's body for a batch tile of `B` (see the module docs). Shapes, with
/// `batch = positions.len() ≤ B`: `x`: `batch × hidden`; `norm_w`: `hidden` (a multiple of
/// `8·C`; `heads = hidden / 128`); `w_qkv`: `3·hidden × hidden`, row-major (out × in); `rope`:
/// per sequence, cos then sin of `pos·θ^(−2i/128)`, 64 each; caches: `batch × heads ×
/// max_len × 128`, sequence `s`'s tokens `0 .. positions[s]` valid, the new one written at
/// `positions[s]`; `attn(i, value)` stores element `i` of `attn`, `batch × hidden` (rank 0
/// stores its head's). Head `head` on this cluster of `C` blocks of 256, `(2B + 1) · hidden /
/// C · 2` bytes of dynamic shared memory.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attention_heads<T: Packed, const B: usize, const R: usize, const V: usize>(
    head: usize,
    x: &[T],
    norm_w: &[T],
    w_qkv: &[T],
    rope: &[f32],
    positions: &[u32],
    k_cache: &Out<T>,
    v_cache: &Out<T>,
    attn: impl Fn(usize, f32),
    max_len: u32,
) {
    let hidden = norm_w.len();
    let (heads, batch) = (hidden / HEAD_DIM, positions.len());
    if batch == 0 || batch > B {
        // No token, or more than the tile holds: fail loudly rather than drop them.
        arch::trap();
    }
    let (rank, blocks) = (cluster::block_rank(), cluster::size());
    let t = thread::rank_in_block() as usize;
    let (warp, lane) = (t / 32, t % 32);
    let row_vectors = hidden / 8;
    let vectors = row_vectors / blocks as usize;
    let first = rank as usize * vectors;

    // 1. The warp's items: R rows × (a step of V vectors per lane over this block's columns).
    let steps = vectors.div_ceil(32 * V);
    let items = QKV / (WARPS * R) * steps;
    let item_row = |i: usize| (warp + WARPS * (i / steps)) * R;
    let item_vector = |i: usize, j: usize| (i % steps) * 32 * V + 32 * j + lane;
    let load = |i: usize| {
        // The item's rows are consecutive in W_qkv: R divides 128, so they share a q/k/v part.
        let base = qkv_row(item_row(i), head, hidden) * row_vectors + first;
        load_item::<T, R, V>(w_qkv, core::array::from_fn(|u| base + u * row_vectors), vectors, i % steps)
    };
    let mut w = load(0);

    // 2. x ⊙ norm_w for this block's columns, staged (see `staged`; zeros past the batch),
    //    and Σ x² per token.
    let xg = shared::dynamic().take::<f32>(stage_units(B) * vectors * 4);
    for i in block::stride_loop(0..B * vectors) {
        let (s, c) = (i / vectors, i % vectors);
        let mut v = [0.0f32; 8];
        if s < batch {
            let (xv, gv) = (global::load16::<T, 8>(x, s * row_vectors + first + c), global::load16::<T, 8>(norm_w, first + c));
            for k in 0..8 {
                v[k] = xv[k].to_f32() * gv[k].to_f32();
            }
        }
        store8(xg, staged::<B>(c, s), v);
    }
    let mut squares = [0.0f32; B];
    unroll!(s in [0 1 2 3 4 5 6 7] {
        if s < B && s < batch {
            for i in block::stride_loop(0..row_vectors) {
                for v in global::load16::<T, 8>(x, s * row_vectors + i) {
                    let f = v.to_f32();
                    squares[s] = f.fma(f, squares[s]);
                }
            }
        }
    });
    let warp_squares = shared!([f32; WARPS * MAX_BATCH]);
    unroll!(s in [0 1 2 3 4 5 6 7] {
        if s < B {
            let total = warp::reduce_sum(squares[s]);
            if lane == 0 {
                warp_squares.store(warp * MAX_BATCH + s, total);
            }
        }
    });
    block::sync();

    // 3. Split-K QKV over this block's columns, summed over the cluster.
    let qkv = shared!([f32; QKV * MAX_BATCH]);
    let mut acc = [[0.0f32; B]; R];
    for i in 0..items {
        unroll!(j in [0 1 2 3] {
            let c = item_vector(i, j);
            if j < V && c < vectors {
                accumulate::<T, B, R, V>(&mut acc, &w, j, xg, c);
            }
        });
        if i + 1 < items {
            w = load(i + 1);
        }
        if i % steps == steps - 1 {
            // One base for the item's results, constant offsets from it.
            let rows = qkv.slice(item_row(i), (B - 1) * QKV + R);
            unroll!(u in [0 1 2 3] {
                unroll!(s in [0 1 2 3 4 5 6 7] {
                    if u < R && s < B {
                        let total = warp::reduce_sum(acc[u][s]);
                        if lane == 0 {
                            rows.store(s * QKV + u, total);
                        }
                        acc[u][s] = 0.0;
                    }
                });
            });
        }
    }
    // W_qkv is streamed: the output projection, launched programmatically after this kernel,
    // may start and issue its W_o loads while the caches stream.
    grid::launch_dependents();
    // The first keys and values of sequence 0 do not depend on q: at batch 1 they are in
    // flight across the cluster reduction (at tile 8, `ptxas` would spill them there).
    let early = B == 1;
    let (group, lane16) = (t / 16, t % 16);
    let share = |pos: u32| (pos * rank / blocks, pos * (rank + 1) / blocks);
    let cache_rows = |s: usize| (s * heads + head) * max_len as usize * (HEAD_DIM / 8) + lane16;
    let key = |s: usize, tok: u32| load_words_out(k_cache, cache_rows(s) + tok as usize * (HEAD_DIM / 8));
    let value = |s: usize, tok: u32| load_words_out(v_cache, cache_rows(s) + tok as usize * (HEAD_DIM / 8));
    let (start, end) = share(positions[0]);
    let no_rows = ([[0; 4]; TOKENS], [[0; 4]; TOKENS]);
    let mut first = if early { first_rows(start, end, &|tok| key(0, tok), &|tok| value(0, tok)) } else { no_rows };
    cluster::reduce(qkv.slice(0, B * QKV), Sum);

    // 4. 1/rms, RoPE on q and k, k and v rounded as the cache keeps them; rank 0 appends.
    for i in block::stride_loop(0..batch * 2 * HEAD_DIM) {
        let (s, e) = (i / (2 * HEAD_DIM), i % (2 * HEAD_DIM));
        let mut sum = 0.0f32;
        for w in 0..WARPS {
            sum += warp_squares.load(w * MAX_BATCH + s);
        }
        let rstd = math::rsqrt(sum / hidden as f32 + EPS);
        let own = qkv.slice(s * QKV, QKV);
        let new_row = ((s * heads + head) * max_len as usize + positions[s] as usize) * HEAD_DIM;
        if e < HEAD_DIM {
            let (part, i) = (e / 64 * HEAD_DIM, e % 64);
            let (lo, hi) = rotate(own.load(part + i) * rstd, own.load(part + i + 64) * rstd, i, &rope[s * HEAD_DIM..]);
            if part == 0 {
                own.store(i, lo);
                own.store(i + 64, hi);
            } else {
                let (lo, hi) = (T::from_f32(lo), T::from_f32(hi));
                own.store(part + i, lo.to_f32());
                own.store(part + i + 64, hi.to_f32());
                if rank == 0 {
                    k_cache.set(new_row + i, lo);
                    k_cache.set(new_row + i + 64, hi);
                }
            }
        } else {
            let d = e - HEAD_DIM;
            let v = T::from_f32(own.load(2 * HEAD_DIM + d) * rstd);
            own.store(2 * HEAD_DIM + d, v.to_f32());
            if rank == 0 {
                v_cache.set(new_row + d, v);
            }
        }
    }
    block::sync();

    // 5. Flash-decoding over this block's share of each sequence's tokens 0 .. pos; rank 0's
    //    group 0 starts from the new token.
    let (states, maxima) = (shared!([f32; MAX_BATCH * STATE]), shared!([f32; MAX_BATCH]));
    for (s, &pos) in positions.iter().enumerate() {
        let own = qkv.slice(s * QKV, QKV);
        let q: [f32; 8] = core::array::from_fn(|k| own.load(lane16 * 8 + k) * Q_SCALE);
        let k_new: [f32; 8] = core::array::from_fn(|k| own.load(HEAD_DIM + lane16 * 8 + k));
        let v_new: [f32; 8] = core::array::from_fn(|k| own.load(2 * HEAD_DIM + lane16 * 8 + k));
        let mut s_new = 0.0f32;
        for k in 0..8 {
            s_new = q[k].fma(k_new[k], s_new);
        }
        let s_new = warp::group_sum::<16, f32>(s_new);
        let mut state = if rank == 0 && group == 0 { Softmax { m: s_new, l: 1.0, o: v_new } } else { Softmax::EMPTY };
        let (start, end) = share(pos);
        if !early || s > 0 {
            first = first_rows(start, end, &|tok| key(s, tok), &|tok| value(s, tok));
        }
        attend::<T>(&mut state, q, start, end, first, |tok| key(s, tok), |tok| value(s, tok));
        merge_block(state, states.slice(s * STATE, STATE), maxima.slice(s, 1));
    }
    merge_cluster(states, maxima, batch);

    // 6. The heads' attention outputs.
    if rank == 0 {
        for i in block::stride_loop(0..batch * HEAD_DIM) {
            let (s, d) = (i / HEAD_DIM, i % HEAD_DIM);
            attn(s * hidden + head * HEAD_DIM + d, states.load(s * STATE + d) / states.load(s * STATE + HEAD_DIM));
        }
    }
}

/// `out = x + W_o · attn` for a batch tile of `B`, rows `8·R·item ..` of it: `R` rows per warp,
/// `V` 16-byte vectors per lane per row per step; the item's first weights are in flight
/// before `input()` (the wait for the attention) returns `attn` (f32), which is staged (see
/// [`staged`]) in `(2B + 1) · hidden · 2` bytes of dynamic shared memory. Shapes: `attn`, `x`,
/// `out`: `batch × hidden`; `w_o`: `hidden × hidden`.
#[inline(always)]
fn o_proj<T: Packed, X: Coherent<f32>, const B: usize, const R: usize, const V: usize>(item: usize, input: impl FnOnce() -> X, w_o: &[T], x: &[T], out: &Out<T>, batch: u32) {
    let batch = batch as usize;
    if batch > B {
        // As in `attention_heads`.
        arch::trap();
    }
    let hidden = x.len() / batch;
    let row_vectors = hidden / 8;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let row0 = (item * WARPS + warp) * R;
    let rows = core::array::from_fn(|u| (row0 + u).min(hidden - 1));
    // W_o does not depend on the attention: the first item is in flight before `attn` is
    // waited for.
    let first = load_item::<T, R, V>(w_o, row_starts(rows, row_vectors), row_vectors, 0);
    let attn = input();
    let stage = shared::dynamic().take::<f32>(stage_units(B) * row_vectors * 4);
    for i in block::stride_loop(0..B * row_vectors) {
        let (s, c) = (i / row_vectors, i % row_vectors);
        let v = if s < batch { [attn.load16::<4>(2 * i), attn.load16::<4>(2 * i + 1)] } else { [[0.0; 4]; 2] };
        store8(stage, staged::<B>(c, s), core::array::from_fn(|k| v[k / 4][k % 4]));
    }
    block::sync();
    let (acc, _) = dot_rows::<T, B, R, V>(w_o, rows, row_vectors, stage, first, None);
    unroll!(u in [0 1 2 3] {
        unroll!(s in [0 1 2 3 4 5 6 7] {
            if u < R && s < B && s < batch {
                let total = warp::reduce_sum(acc[u][s]);
                let row = row0 + u;
                if lane == 0 && row < hidden {
                    out.set(s * hidden + row, T::from_f32(x[s * hidden + row].to_f32() + total));
                }
            }
        });
    });
}

/// The attention output of the persistent block, published a head at a time.
pub const ATTN_TILE: u32 = HEAD_DIM as u32;

/// Rows per warp of the persistent block's output projection: items of 32 rows (128 at hidden
/// 4096), so that one wave of blocks takes them all.
pub const PERSISTENT_O_ROWS: usize = 4;

/// Points of a block's [`persistent_block`] timeline: its start, its heads done (0 without
/// one), its output projection's input ready (0 without an item), its end.
pub const PHASES: usize = 4;

/// Stamps `%globaltimer` as this block's `point` of `timeline` (`blocks × PHASES` values, or
/// one, when nothing is stamped).
#[inline(always)]
fn stamp(timeline: &Out<u64>, point: usize) {
    // The length first: a timeline that is off costs one compare (the rank's read first
    // spilled 88 more bytes in `persistent_block`).
    if timeline.len() > 1 && thread::rank_in_block() == 0 {
        crate::stamp(timeline, PHASES, point);
    }
}

/// The persistent block at batch 1 (see the module docs): clusters take heads round robin
/// ([`grid::cluster_round_robin`]), run [`attention_heads`] and publish the head's attention
/// output; then blocks take the output projection's items round robin from the first block
/// past the heads' clusters (so that blocks with no head start streaming `W_o` at once),
/// each waiting for all heads' outputs. `timeline`: see [`PHASES`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn persistent_block<T: Packed>(x: &[T], norm_w: &[T], w_qkv: &[T], rope: &[f32], positions: &[u32], k_cache: &Out<T>, v_cache: &Out<T>, attn: &Published<f32>, w_o: &[T], out: &Out<T>, max_len: u32, timeline: &Out<u64>) {
    stamp(timeline, 0);
    let hidden = norm_w.len();
    let heads = (hidden / HEAD_DIM) as u32;
    for head in grid::cluster_round_robin(heads, 0) {
        let head = head as usize;
        attention_heads::<T, 1, { QKV_ITEM[0].0 }, { QKV_ITEM[0].1 }>(head, x, norm_w, w_qkv, rope, positions, k_cache, v_cache, |i, v| attn.set(i, v), max_len);
        if cluster::block_rank() == 0 {
            attn.publish(head..head + 1);
        }
        stamp(timeline, 1);
    }
    let items = (hidden / (WARPS * PERSISTENT_O_ROWS)) as u32;
    for item in grid::round_robin(items, heads * cluster::size()) {
        let input = || {
            let ready = attn.wait(0..hidden);
            stamp(timeline, 2);
            ready
        };
        o_proj::<T, _, 1, PERSISTENT_O_ROWS, { O_VECTORS[0] }>(item as usize, input, w_o, x, out, 1);
    }
    stamp(timeline, 3);
}

/// 16-byte vectors per lane per row of an item of [`qkv_rope`]: with its 2 rows, 8 loads per
/// thread; the next item's are issued before this one's are used, so up to 16 (256 bytes)
/// are in flight.
const SPREAD_VECTORS: usize = 4;
/// Row pairs per warp of [`qkv_rope`]: at hidden 4096, 256 blocks, one wave of two per SM,
/// each staging `x` once for 24 pairs, its warps' items streaming from one pair into the next.
const SPREAD_PAIRS: usize = 3;

/// Spread 1/3's body (batch 1): `W_qkv · RMSNorm(x)` over the whole GPU, a warp per pair of
/// rows `i`, `i + 64` of one head's q, k or v (whole rows, no split-K: RoPE's pairs meet in
/// the warp), then RoPE; q goes to `q` (f32), k and v to the caches at `positions[0]`, rounded
/// to `T`; a warp takes [`SPREAD_PAIRS`] pairs in turn. Every block stages `x ⊙ norm_w` in
/// `3 · hidden · 2` bytes of dynamic shared memory and sums `x²` itself (16 KB from L2 a
/// block) after its first `W_qkv` loads are issued. Grid `3·hidden / 48` blocks of 256.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn qkv_rope<T: Packed, const V: usize>(
    x: &[T],
    norm_w: &[T],
    w_qkv: &[T],
    rope: &[f32],
    positions: &[u32],
    q: &Out<f32>,
    k_cache: &Out<T>,
    v_cache: &Out<T>,
    max_len: u32,
) {
    if positions.len() != 1 {
        // One token a step; fail loudly rather than drop the others.
        arch::trap();
    }
    let hidden = norm_w.len();
    let row_vectors = hidden / 8;
    let lane = warp::lane() as usize;
    // The warp's pairs `warp + j · warps`, `j < SPREAD_PAIRS`, over the grid's warps.
    let (warp, warps) = (block::index_x() as usize * WARPS + warp::index_in_block() as usize, grid::dim().x as usize * WARPS);
    // Pair `p`'s part (q, k, v), head, first row `i` within the head, and rows.
    let pair = |p: usize| {
        let (part, within) = (p / (hidden / 2), p % (hidden / 2));
        let (head, i) = (within / 64, within % 64);
        let row = part * hidden + head * HEAD_DIM + i;
        (part, head, i, [row, row + 64])
    };
    // One item in flight across the staging below, two in the loop.
    let mut item = load_item::<T, 2, V>(w_qkv, row_starts(pair(warp).3, row_vectors), row_vectors, 0);
    // Nothing of the attention kernel's early work (the cache's past tokens) is written here.
    grid::launch_dependents();

    let xg = shared::dynamic().take::<f32>(stage_units(1) * row_vectors * 4);
    let mut squares = 0.0f32;
    // Two vectors a thread per round, both loaded before either is used: one round trip to
    // L2 at hidden 4096, not two.
    let (t, threads) = (thread::rank_in_block() as usize, BLOCK as usize);
    let load = |c: usize| (c < row_vectors).then(|| (global::load16::<T, 8>(x, c), global::load16::<T, 8>(norm_w, c)));
    let mut stage = |c: usize, vectors: Option<([T; 8], [T; 8])>| {
        if let Some((xv, gv)) = vectors {
            let mut v = [0.0f32; 8];
            for k in 0..8 {
                let f = xv[k].to_f32();
                squares = f.fma(f, squares);
                v[k] = f * gv[k].to_f32();
            }
            store8(xg, staged::<1>(c, 0), v);
        }
    };
    for base in (0..row_vectors).step_by(2 * threads) {
        let (c0, c1) = (base + t, base + threads + t);
        let (v0, v1) = (load(c0), load(c1));
        stage(c0, v0);
        stage(c1, v1);
    }
    // Its barriers also publish `xg`.
    let rstd = math::rsqrt(block::reduce_sum(squares, shared!([f32; WARPS])) / hidden as f32 + EPS);
    let new_row = |head: usize| (head * max_len as usize + positions[0] as usize) * HEAD_DIM;
    for j in 0..SPREAD_PAIRS {
        let (part, head, i, rows) = pair(warp + j * warps);
        let then = (j + 1 < SPREAD_PAIRS).then(|| pair(warp + (j + 1) * warps).3);
        let (acc, next) = dot_rows::<T, 1, 2, V>(w_qkv, rows, row_vectors, xg, item, then);
        item = next;
        let (lo, hi) = (warp::reduce_sum(acc[0][0]) * rstd, warp::reduce_sum(acc[1][0]) * rstd);
        if lane == 0 {
            if part == 2 {
                v_cache.set(new_row(head) + i, T::from_f32(lo));
                v_cache.set(new_row(head) + i + 64, T::from_f32(hi));
            } else {
                let (lo, hi) = rotate(lo, hi, i, rope);
                if part == 0 {
                    q.set(head * HEAD_DIM + i, lo);
                    q.set(head * HEAD_DIM + i + 64, hi);
                } else {
                    k_cache.set(new_row(head) + i, T::from_f32(lo));
                    k_cache.set(new_row(head) + i + 64, T::from_f32(hi));
                }
            }
        }
    }
}

/// Spread 2/3's body (batch 1): a head's attention over its cache, tokens `0 ..= pos` (`pos =
/// positions[0]`), the new one appended by spread 1/3, flash-decoding split over a cluster of
/// `C` blocks per head (as fused 1/2's step 5-6). Launched programmatically after spread 1/3:
/// each block issues its first loads of the cached tokens `0 .. pos` (which spread 1/3 does not
/// write) before [`grid::wait_for_prerequisites`], then reads `q` and the new k, v. Grid
/// `heads × C` blocks of 256, cluster `C`.
#[inline(always)]
fn attend_appended<T: Packed>(q: &[f32], positions: &[u32], k_cache: &Out<T>, v_cache: &Out<T>, attn: &Out<f32>, max_len: u32) {
    let (head, rank, blocks) = (cluster::index_in_grid().x as usize, cluster::block_rank(), cluster::size());
    let t = thread::rank_in_block() as usize;
    let (group, lane16) = (t / 16, t % 16);
    let pos = positions[0];
    let (start, end) = (pos * rank / blocks, pos * (rank + 1) / blocks);
    let rows = head * max_len as usize * (HEAD_DIM / 8) + lane16;
    let key = |tok: u32| load_words_out(k_cache, rows + tok as usize * (HEAD_DIM / 8));
    let value = |tok: u32| load_words_out(v_cache, rows + tok as usize * (HEAD_DIM / 8));
    // An empty share loads nothing: its clamped row could be the one being appended.
    let first = if start < end { first_rows(start, end, &key, &value) } else { ([[0; 4]; TOKENS], [[0; 4]; TOKENS]) };
    // The output projection may start streaming W_o: it waits for this grid before reading `attn`.
    grid::launch_dependents();
    grid::wait_for_prerequisites();

    let qs: [f32; 8] = core::array::from_fn(|k| q[head * HEAD_DIM + lane16 * 8 + k] * Q_SCALE);
    let (k_new, v_new) = (widen8::<T>(key(pos)), widen8::<T>(value(pos)));
    let mut s_new = 0.0f32;
    for k in 0..8 {
        s_new = qs[k].fma(k_new[k], s_new);
    }
    let s_new = warp::group_sum::<16, f32>(s_new);
    let mut state = if rank == 0 && group == 0 { Softmax { m: s_new, l: 1.0, o: v_new } } else { Softmax::EMPTY };
    attend::<T>(&mut state, qs, start, end, first, key, value);
    let (merged, maximum) = (shared!([f32; STATE]), shared!([f32; 1]));
    merge_block(state, merged, maximum);
    merge_cluster(merged, maximum, 1);
    if rank == 0 && t < HEAD_DIM {
        attn.set(head * HEAD_DIM + t, merged.load(t) / merged.load(HEAD_DIM));
    }
}

/// Rows per warp of the output projection at batch 1, and at batch tile 8.
pub const O_ROWS: [usize; 2] = [2, 4];

macro_rules! decode_kernels {
    ($($t:ident: $attention:ident, $attention8:ident, $o_proj:ident, $o_proj8:ident, $qkv_rope:ident, $attend:ident, $persistent:ident;)*) => {$(
        #[doc = concat!("Fused 1/2, ", stringify!($t), ", batch 1: RMSNorm → QKV → RoPE → append → attention, a cluster per head (see the module docs).")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        #[allow(clippy::too_many_arguments)]
        pub fn $attention(x: &[$t], norm_w: &[$t], w_qkv: &[$t], rope: &[f32], positions: &[u32], k_cache: Out<$t>, v_cache: Out<$t>, attn: Out<f32>, max_len: u32) {
            let head = cluster::index_in_grid().x as usize;
            attention_heads::<$t, 1, { QKV_ITEM[0].0 }, { QKV_ITEM[0].1 }>(head, x, norm_w, w_qkv, rope, positions, &k_cache, &v_cache, |i, v| attn.set(i, v), max_len);
        }

        #[doc = concat!("Fused 1/2, ", stringify!($t), ", batch 2-8: as the batch-1 kernel.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        #[allow(clippy::too_many_arguments)]
        pub fn $attention8(x: &[$t], norm_w: &[$t], w_qkv: &[$t], rope: &[f32], positions: &[u32], k_cache: Out<$t>, v_cache: Out<$t>, attn: Out<f32>, max_len: u32) {
            let head = cluster::index_in_grid().x as usize;
            attention_heads::<$t, 8, { QKV_ITEM[1].0 }, { QKV_ITEM[1].1 }>(head, x, norm_w, w_qkv, rope, positions, &k_cache, &v_cache, |i, v| attn.set(i, v), max_len);
        }

        #[doc = concat!("Fused 2/2 (and separate 5/5), ", stringify!($t), ", batch 1: `out = x + W_o · attn`; grid `hidden / 16` blocks of 256.")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $o_proj(attn: Out<f32>, w_o: &[$t], x: &[$t], out: Out<$t>, batch: u32) {
            let input = || { grid::wait_for_prerequisites(); &attn };
            o_proj::<$t, _, 1, { O_ROWS[0] }, { O_VECTORS[0] }>(block::index_x() as usize, input, w_o, x, &out, batch);
        }

        #[doc = concat!("Fused 2/2, ", stringify!($t), ", batch 2-8: `out = x + W_o · attn`; grid `hidden / 32` blocks of 256.")]
        #[kernel(launch_bounds(max_threads = 256))]
        pub fn $o_proj8(attn: Out<f32>, w_o: &[$t], x: &[$t], out: Out<$t>, batch: u32) {
            let input = || { grid::wait_for_prerequisites(); &attn };
            o_proj::<$t, _, 8, { O_ROWS[1] }, { O_VECTORS[1] }>(block::index_x() as usize, input, w_o, x, &out, batch);
        }

        #[doc = concat!("The persistent block, ", stringify!($t), ", batch 1: both launches of the fused variant in one (see the module docs).")]
        #[kernel(persistent, launch_bounds(max_threads = 256, min_blocks = 2))]
        #[allow(clippy::too_many_arguments)]
        pub fn $persistent(x: &[$t], norm_w: &[$t], w_qkv: &[$t], rope: &[f32], positions: &[u32], k_cache: Out<$t>, v_cache: Out<$t>, attn: Published<f32>, w_o: &[$t], out: Out<$t>, max_len: u32, timeline: Out<u64>) {
            persistent_block::<$t>(x, norm_w, w_qkv, rope, positions, &k_cache, &v_cache, &attn, w_o, &out, max_len, &timeline);
        }

        #[doc = concat!("Spread 1/3, ", stringify!($t), ", batch 1: RMSNorm → QKV → RoPE → append over the whole GPU (see the module docs).")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        #[allow(clippy::too_many_arguments)]
        pub fn $qkv_rope(x: &[$t], norm_w: &[$t], w_qkv: &[$t], rope: &[f32], positions: &[u32], q: Out<f32>, k_cache: Out<$t>, v_cache: Out<$t>, max_len: u32) {
            qkv_rope::<$t, SPREAD_VECTORS>(x, norm_w, w_qkv, rope, positions, &q, &k_cache, &v_cache, max_len);
        }

        #[doc = concat!("Spread 2/3, ", stringify!($t), ", batch 1: a head's attention over its cache, a cluster per head (see the module docs).")]
        #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
        pub fn $attend(q: &[f32], positions: &[u32], k_cache: Out<$t>, v_cache: Out<$t>, attn: Out<f32>, max_len: u32) {
            attend_appended::<$t>(q, positions, &k_cache, &v_cache, &attn, max_len);
        }
    )*};
}

decode_kernels! {
    f16: decode_attention_f16, decode_attention_f16_b8, decode_o_proj_f16, decode_o_proj_f16_b8, decode_qkv_rope_f16, decode_attend_appended_f16, decode_block_persistent_f16;
    bf16: decode_attention_bf16, decode_attention_bf16_b8, decode_o_proj_bf16, decode_o_proj_bf16_b8, decode_qkv_rope_bf16, decode_attend_appended_bf16, decode_block_persistent_bf16;
}

// The same block as five kernels, f16, batch 1, f32 intermediates in global memory.

/// Separate 1/5: `xn = RMSNorm(x)·w`, one block of 256.
#[kernel(launch_bounds(max_threads = 256))]
pub fn decode_rms_norm(x: &[f16], norm_w: &[f16], xn: Out<f32>) {
    let rstd = rms_scale(x, shared!([f32; 32]));
    for i in block::stride_loop(0..x.len()) {
        xn.set(i, x[i].to_f32() * rstd * norm_w[i].to_f32());
    }
}

/// `y[row] = W[row, :]·v` for this block's `WARPS × QKV_ROWS` rows (`v` staged in dynamic
/// shared memory, `4·len(v)` bytes): a warp per 4 rows, lanes striding them 16 bytes at a
/// time; `done(row, y)` runs in lane 0.
#[inline(always)]
fn gemv(w: &[f16], v: &[f32], done: impl Fn(usize, f32)) {
    let n = v.len();
    let staged = shared::dynamic().take::<f32>(n);
    for i in block::stride_loop(0..n) {
        staged.store(i, v[i]);
    }
    block::sync();
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let row0 = (block::index_x() as usize * WARPS + warp) * QKV_ROWS;
    let chunks = n / 8;
    let mut acc = [0.0f32; QKV_ROWS];
    let mut c = lane;
    while c < chunks {
        let x = load8(staged, 2 * c);
        // SAFETY: weights are written by the host alone.
        let ws: [[f16; 8]; QKV_ROWS] = core::array::from_fn(|u| unsafe { global::load16_invariant::<f16, 8>(w, (row0 + u) * chunks + c) });
        for u in 0..QKV_ROWS {
            acc[u] = dot8_f16(ws[u], x, acc[u]);
        }
        c += 32;
    }
    for (u, acc) in acc.into_iter().enumerate() {
        let y = warp::reduce_sum(acc);
        if lane == 0 {
            done(row0 + u, y);
        }
    }
}

/// Separate 2/5: `qkv = W_qkv · xn`; grid `3·hidden / 32` blocks of 256.
#[kernel(launch_bounds(max_threads = 256))]
pub fn decode_qkv(xn: &[f32], w_qkv: &[f16], qkv: Out<f32>) {
    gemv(w_qkv, xn, |row, y| qkv.set(row, y));
}

/// Separate 3/5: RoPE on q and k, k and v appended to the cache at `pos`; a block of 128 per head.
#[kernel(launch_bounds(max_threads = 128))]
pub fn decode_rope_append(qkv: &[f32], rope: &[f32], q: Out<f32>, k_cache: Out<f16>, v_cache: Out<f16>, pos: u32, max_len: u32) {
    let hidden = q.len();
    let (head, t) = (block::index_x() as usize, thread::index_x() as usize);
    let (i, column) = (t % 64, head * HEAD_DIM + t % 64);
    let new_row = (head * max_len as usize + pos as usize) * HEAD_DIM;
    if t < 64 {
        let (lo, hi) = rotate(qkv[column], qkv[column + 64], i, rope);
        q.set(column, lo);
        q.set(column + 64, hi);
    } else {
        let (lo, hi) = rotate(qkv[hidden + column], qkv[hidden + column + 64], i, rope);
        k_cache.set(new_row + i, f16::from_f32(lo));
        k_cache.set(new_row + i + 64, f16::from_f32(hi));
    }
    v_cache.set(new_row + t, f16::from_f32(qkv[2 * hidden + head * HEAD_DIM + t]));
}

/// Separate 4/5: attention of each head's q over cache tokens `0 .. len`, flash-decoding split
/// over a cluster of `C` blocks per head; grid `heads × C` blocks of 256.
#[kernel(launch_bounds(max_threads = 256))]
pub fn decode_attend(q: &[f32], k_cache: &[f16], v_cache: &[f16], attn: Out<f32>, len: u32, max_len: u32) {
    let (head, rank, blocks) = (cluster::index_in_grid().x as usize, cluster::block_rank(), cluster::size());
    let t = thread::rank_in_block() as usize;
    let lane16 = t % 16;
    let qs: [f32; 8] = core::array::from_fn(|k| q[head * HEAD_DIM + lane16 * 8 + k] * Q_SCALE);
    let mut state = Softmax::EMPTY;
    let rows = head * max_len as usize * (HEAD_DIM / 8) + lane16;
    let key = |tok: u32| load_words(k_cache, rows + tok as usize * (HEAD_DIM / 8));
    let value = |tok: u32| load_words(v_cache, rows + tok as usize * (HEAD_DIM / 8));
    let (start, end) = (len * rank / blocks, len * (rank + 1) / blocks);
    attend::<f16>(&mut state, qs, start, end, first_rows(start, end, &key, &value), key, value);
    let (merged, maximum) = (shared!([f32; STATE]), shared!([f32; 1]));
    merge_block(state, merged, maximum);
    merge_cluster(merged, maximum, 1);
    if rank == 0 && t < HEAD_DIM {
        attn.set(head * HEAD_DIM + t, merged.load(t) / merged.load(HEAD_DIM));
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
