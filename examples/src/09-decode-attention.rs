//! 09 — the decode step of a Llama attention block in one kernel: RMSNorm → QKV projection →
//! RoPE → append K/V to the cache → attention over the cache → output projection + residual,
//! for one token (batch 1, fp16 weights and cache, f32 arithmetic), after ClusterFusion.
//!
//! **Fused** ([`decode_attention`], one launch): one cluster of `C` blocks per head (grid
//! `heads × C`, `C` chosen at launch, `hidden / C ≤ 512`). Each block
//! 1. computes RMSNorm(x) for its `1/C` of the columns (every block recomputes the norm: 8 KB
//!    from L2), held in registers;
//! 2. multiplies it with the same columns of the head's 384 rows of `W_qkv` (split-K: a warp
//!    per 4 rows, 16-byte loads, all issued before use), and `cluster::reduce` sums the
//!    blocks' partial q, k, v in rank order;
//! 3. rotates q and k (RoPE, Hugging Face's rotate-half); rank 0 appends k, v to the cache;
//! 4. runs flash-decoding over its `1/C` of the cached tokens: 16-lane groups, one token per
//!    group, 4 tokens per group in flight, an online softmax in `exp2` units; rank 0's first
//!    group starts from the new token, taken from shared memory;
//! 5. merges the groups' (max, sum, o) in group order, then the cluster's in rank order
//!    (`cluster::reduce` with `Max`, then `Sum`);
//! 6. multiplies o_head with its `1/C` of the rows of `W_o[:, head]` into `partials[head]`.
//!
//! The output projection sums over heads — a dependence across clusters. Instead of a second
//! launch or float atomics, each block counts arrivals (`atom.add.u32` after a GPU-scope
//! fence); the last of the `heads` blocks with its rank to arrive adds the heads' partials in
//! head order and the residual, and resets its counter. Integer atomics decide only *who*
//! sums, never the order, so the output is deterministic.
//!
//! Sizing: at hidden 4096 clusters of 8 give 256 blocks of 256 threads, two per SM (at most
//! 128 registers, `min_blocks = 2`; 10.5 KB of shared memory), so every block is resident at
//! once and each SM keeps ~64 KB of 16-byte loads in flight (8 per thread in each stage), the
//! concurrency HBM needs to stream the 134 MB of weights and the cache near 4.3 TB/s.
//!
//! **Separate** (five launches, f32 intermediates in global memory, as a framework would):
//! [`decode_rms_norm`], [`decode_qkv`], [`decode_rope_append`], [`decode_attend`] (the same
//! flash-decoding and cluster merge) and [`decode_o_proj`].

use clusterfuse::arch;
use clusterfuse::prelude::*;

/// Dimensions per head.
pub const HEAD_DIM: usize = 128;
/// Threads per block of the fused kernel, the attention and the GEMVs.
pub const BLOCK: u32 = 256;
/// ε of the RMSNorm.
pub const EPS: f32 = 1e-5;
/// The most columns one block of the fused kernel takes: 32 lanes × 2 vectors × 8 (so
/// clusters of at least 8 at hidden 4096).
pub const MAX_SLICE: usize = 32 * X_CHUNKS * 8;
/// RoPE's θ.
pub const THETA: f64 = 10000.0;

const WARPS: usize = BLOCK as usize / 32;
/// 16-lane groups: a group covers one 128-dimension row (K, V or W_o) in 16-byte vectors.
const GROUPS: usize = BLOCK as usize / 16;
/// 16-byte vectors of RMSNorm(x) each lane holds in the split-K projection.
const X_CHUNKS: usize = 2;
/// W_qkv rows per warp per step (fused), and per warp (separate GEMV).
const QKV_ROWS: usize = 4;
/// Tokens per group per step of the flash-decoding loop.
const TOKENS: usize = 4;
/// W_o rows per group per step (fused).
const O_ROWS: usize = 8;
/// A score below any real one (finite, so that 2^(m − m) stays 1).
const NO_SCORE: f32 = -1e30;
/// log2(e) / √128: scores in `exp2` units.
const Q_SCALE: f32 = core::f32::consts::LOG2_E * 0.088_388_35;

/// `body` once for each listed `$i`, unrolled, so that register arrays are indexed by
/// constants (a run-time index sends them to local memory).
macro_rules! unroll {
    ($i:ident in [$($n:literal)*] $body:block) => {{
        $( { let $i: usize = $n; $body } )*
    }};
}
const _: () = assert!(X_CHUNKS == 2 && QKV_ROWS == 4 && O_ROWS == 8, "the unrolled loops list 2, 4 and 8 indices");

/// `acc + Σ w[k]·x[k]`, in f32.
#[inline(always)]
fn dot8(w: [f16; 8], x: [f32; 8], acc: f32) -> f32 {
    let mut acc = acc;
    for k in 0..8 {
        acc = w[k].to_f32().fma(x[k], acc);
    }
    acc
}

/// Sum over the 16 lanes of the caller's half-warp (every lane of the warp calls it).
#[inline(always)]
fn group_sum(value: f32) -> f32 {
    let mut v = value;
    let mut mask = 8;
    while mask > 0 {
        v += warp::shuffle_xor(v, mask);
        mask >>= 1;
    }
    v
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

/// Folds tokens `start .. end` into `state`: group `g` takes tokens `base + g + GROUPS·u`,
/// `TOKENS` at a time, every K and V load issued before the first is used. `key(t)` and
/// `value(t)` are the lane's 16 bytes of token `t`'s rows; `q` is pre-scaled by `Q_SCALE`.
#[inline(always)]
fn attend(state: &mut Softmax, q: [f32; 8], start: u32, end: u32, key: impl Fn(u32) -> [f16; 8], value: impl Fn(u32) -> [f16; 8]) {
    let group = thread::rank_in_block() / 16;
    let mut base = start;
    while base < end {
        let zero = [f16::from_f32(0.0); 8];
        let (mut ks, mut vs, mut valid) = ([zero; TOKENS], [zero; TOKENS], [false; TOKENS]);
        for u in 0..TOKENS {
            let t = base + group + (GROUPS * u) as u32;
            valid[u] = t < end;
            if valid[u] {
                ks[u] = key(t);
                vs[u] = value(t);
            }
        }
        let mut s = [NO_SCORE; TOKENS];
        let mut m = state.m;
        for u in 0..TOKENS {
            let score = group_sum(dot8(ks[u], q, 0.0));
            if valid[u] {
                s[u] = score;
                m = m.max(score);
            }
        }
        let rescale = math::exp2(state.m - m);
        state.l *= rescale;
        for k in 0..8 {
            state.o[k] *= rescale;
        }
        for u in 0..TOKENS {
            let p = if valid[u] { math::exp2(s[u] - m) } else { 0.0 };
            state.l += p;
            for (o, v) in state.o.iter_mut().zip(&vs[u]) {
                *o = p.fma(v.to_f32(), *o);
            }
        }
        state.m = m;
        base += (GROUPS * TOKENS) as u32;
    }
}

/// Merges every group's `state` over the cluster: the block's groups in group order, then the
/// blocks in rank order (`cluster::reduce` of the maxima, then of the rescaled sums). Returns
/// `merged`: `merged[d] = Σ 2^(s − M)·v_d` for `d < 128` and `merged[128] = Σ 2^(s − M)`,
/// the same in every block. Every thread of the cluster calls it.
#[inline(always)]
fn merge(state: Softmax) -> SharedSlice<f32> {
    let groups = shared!([f32; GROUPS * (HEAD_DIM + 2)]);
    let maximum = shared!([f32; 4]);
    let merged = shared!([f32; HEAD_DIM + 4]);
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
    if t < 4 {
        maximum.store(t, block_max);
    }
    cluster::reduce(maximum, Max);
    let weight = math::exp2(block_max - maximum.load(0));
    if t < HEAD_DIM {
        merged.store(t, sum * weight);
    } else if t < HEAD_DIM + 4 {
        merged.store(t, if t == HEAD_DIM { l * weight } else { 0.0 });
    }
    cluster::reduce(merged, Sum);
    merged
}

/// Row of `W_qkv` that is row `r` (`0 .. 384`: q, k, v) of head `head`.
#[inline(always)]
fn qkv_row(r: usize, head: usize, hidden: usize) -> usize {
    r / HEAD_DIM * hidden + head * HEAD_DIM + r % HEAD_DIM
}

/// The fused decode block (see the module docs). Shapes: `x`, `norm_w`, `out`: `hidden`
/// (a multiple of 128; `heads = hidden / 128`); `w_qkv`: `3·hidden × hidden`, `w_o`:
/// `hidden × hidden`, row-major (out × in); `rope`: cos then sin of `pos·θ^(−2i/128)`, 64 each;
/// caches: `heads × max_len × 128`, tokens `0 .. pos` valid, the new one written at `pos`;
/// `partials`: `heads × hidden` scratch; `arrivals`: `C` counters, zero before the first
/// launch (each launch leaves them zero). Grid `heads × C` blocks of 256, cluster `C`.
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
#[allow(clippy::too_many_arguments)]
pub fn decode_attention(
    x: &[f16],
    norm_w: &[f16],
    w_qkv: &[f16],
    w_o: &[f16],
    rope: &[f32],
    k_cache: Out<f16>,
    v_cache: Out<f16>,
    partials: Out<f32>,
    arrivals: Out<u32>,
    out: Out<f16>,
    pos: u32,
    max_len: u32,
) {
    let hidden = x.len();
    let heads = hidden / HEAD_DIM;
    let (head, rank, blocks) = (cluster::index_in_grid().x as usize, cluster::block_rank(), cluster::size());
    let t = thread::rank_in_block() as usize;
    let (warp, lane) = (t / 32, t % 32);

    // 1. RMSNorm(x) for this block's columns: lane `l` holds vectors `l, l + 32, ..`.
    let chunks = hidden / 8 / blocks as usize;
    let first = rank as usize * chunks;
    let rstd = rms_scale(x, shared!([f32; 32]));
    let mut xn = [[0.0f32; 8]; X_CHUNKS];
    unroll!(j in [0 1] {
        let c = lane + 32 * j;
        if c < chunks {
            let (xv, wv) = (global::load16::<f16, 8>(x, first + c), global::load16::<f16, 8>(norm_w, first + c));
            for k in 0..8 {
                xn[j][k] = xv[k].to_f32() * rstd * wv[k].to_f32();
            }
        }
    });

    // 2. Split-K QKV: this block's columns of the head's 384 rows, summed over the cluster.
    let qkv = shared!([f32; 3 * HEAD_DIM]);
    let mut r0 = warp * QKV_ROWS;
    while r0 < 3 * HEAD_DIM {
        let mut w = [[[f16::from_f32(0.0); 8]; X_CHUNKS]; QKV_ROWS];
        unroll!(u in [0 1 2 3] {
            let row = qkv_row(r0 + u, head, hidden) * (hidden / 8) + first;
            unroll!(j in [0 1] {
                let c = lane + 32 * j;
                if c < chunks {
                    w[u][j] = global::load16::<f16, 8>(w_qkv, row + c);
                }
            });
        });
        unroll!(u in [0 1 2 3] {
            let mut acc = 0.0f32;
            unroll!(j in [0 1] {
                acc = dot8(w[u][j], xn[j], acc);
            });
            let total = warp::reduce_sum(acc);
            if lane == 0 {
                qkv.store(r0 + u, total);
            }
        });
        r0 += WARPS * QKV_ROWS;
    }
    cluster::reduce(qkv, Sum);

    // 3. RoPE on q and k; k and v rounded to f16 as the cache keeps them; rank 0 appends.
    let new_row = (head * max_len as usize + pos as usize) * HEAD_DIM;
    if t < HEAD_DIM {
        let (part, i) = (t / 64 * HEAD_DIM, t % 64);
        let (lo, hi) = rotate(qkv.load(part + i), qkv.load(part + i + 64), i, rope);
        if part == 0 {
            qkv.store(i, lo);
            qkv.store(i + 64, hi);
        } else {
            let (lo, hi) = (f16::from_f32(lo), f16::from_f32(hi));
            qkv.store(part + i, lo.to_f32());
            qkv.store(part + i + 64, hi.to_f32());
            if rank == 0 {
                k_cache.set(new_row + i, lo);
                k_cache.set(new_row + i + 64, hi);
            }
        }
    } else if t < 2 * HEAD_DIM {
        let d = t - HEAD_DIM;
        let v = f16::from_f32(qkv.load(2 * HEAD_DIM + d));
        qkv.store(2 * HEAD_DIM + d, v.to_f32());
        if rank == 0 {
            v_cache.set(new_row + d, v);
        }
    }
    block::sync();

    // 4. Flash-decoding over this block's share of tokens 0 .. pos; rank 0's group 0 starts
    //    from the new token.
    let (group, lane16) = (t / 16, t % 16);
    let (mut q, mut k_new, mut v_new) = ([0.0f32; 8], [0.0f32; 8], [0.0f32; 8]);
    for k in 0..8 {
        q[k] = qkv.load(lane16 * 8 + k) * Q_SCALE;
        k_new[k] = qkv.load(HEAD_DIM + lane16 * 8 + k);
        v_new[k] = qkv.load(2 * HEAD_DIM + lane16 * 8 + k);
    }
    let mut s_new = 0.0f32;
    for k in 0..8 {
        s_new = q[k].fma(k_new[k], s_new);
    }
    let s_new = group_sum(s_new);
    let mut state = if rank == 0 && group == 0 { Softmax { m: s_new, l: 1.0, o: v_new } } else { Softmax::EMPTY };
    let head_vectors = head * max_len as usize * (HEAD_DIM / 8) + lane16;
    let key = |tok: u32| k_cache.load16::<8>(head_vectors + tok as usize * (HEAD_DIM / 8));
    let value = |tok: u32| v_cache.load16::<8>(head_vectors + tok as usize * (HEAD_DIM / 8));
    attend(&mut state, q, pos * rank / blocks, pos * (rank + 1) / blocks, key, value);

    // 5. The head's attention output, the same in every block of the cluster.
    let merged = merge(state);
    let inv_l = 1.0 / merged.load(HEAD_DIM);
    let mut o = [0.0f32; 8];
    for (k, o) in o.iter_mut().enumerate() {
        *o = merged.load(lane16 * 8 + k) * inv_l;
    }

    // 6. This block's rows of W_o[:, head] · o into partials[head].
    let rows = hidden / blocks as usize;
    let (row0, row1) = (rank as usize * rows, (rank as usize + 1) * rows);
    let mut base = row0;
    while base < row1 {
        let mut w = [[f16::from_f32(0.0); 8]; O_ROWS];
        unroll!(u in [0 1 2 3 4 5 6 7] {
            let row = base + group + GROUPS * u;
            if row < row1 {
                w[u] = global::load16::<f16, 8>(w_o, row * (hidden / 8) + head * (HEAD_DIM / 8) + lane16);
            }
        });
        unroll!(u in [0 1 2 3 4 5 6 7] {
            let sum = group_sum(dot8(w[u], o, 0.0));
            let row = base + group + GROUPS * u;
            if row < row1 && lane16 == 0 {
                partials.set(head * hidden + row, sum);
            }
        });
        base += GROUPS * O_ROWS;
    }

    // 7. The last of the heads' blocks of this rank to arrive sums rows row0 .. row1. Every
    //    writer fences (release) before the barrier; the counting thread fences (acquire)
    //    after its atomic, and every reader again after the barrier.
    let last = shared!([u32; 1]);
    arch::fence_acq_rel_gpu();
    block::sync();
    if t == 0 {
        let arrived = arrivals.atomic_add(rank as usize, 1);
        arch::fence_acq_rel_gpu();
        last.store(0, u32::from(arrived as usize == heads - 1));
    }
    block::sync();
    if last.load(0) == 1 {
        arch::fence_acq_rel_gpu();
        for row in block::stride_loop(row0..row1) {
            let mut sum = 0.0f32;
            let mut h = 0;
            while h + 8 <= heads {
                let p: [f32; 8] = core::array::from_fn(|k| partials.get((h + k) * hidden + row));
                for v in p {
                    sum += v;
                }
                h += 8;
            }
            while h < heads {
                sum += partials.get(h * hidden + row);
                h += 1;
            }
            out.set(row, f16::from_f32(x[row].to_f32() + sum));
        }
        if t == 0 {
            arrivals.set(rank as usize, 0);
        }
    }
}

// The same block as five kernels, f32 intermediates in global memory.

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
        let (lo, hi) = (staged.load16::<4>(2 * c), staged.load16::<4>(2 * c + 1));
        let x = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
        let ws: [[f16; 8]; QKV_ROWS] = core::array::from_fn(|u| global::load16::<f16, 8>(w, (row0 + u) * chunks + c));
        for u in 0..QKV_ROWS {
            acc[u] = dot8(ws[u], x, acc[u]);
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
    let mut qs = [0.0f32; 8];
    for (k, qs) in qs.iter_mut().enumerate() {
        *qs = q[head * HEAD_DIM + lane16 * 8 + k] * Q_SCALE;
    }
    let mut state = Softmax::EMPTY;
    let head_vectors = head * max_len as usize * (HEAD_DIM / 8) + lane16;
    let key = |tok: u32| global::load16::<f16, 8>(k_cache, head_vectors + tok as usize * (HEAD_DIM / 8));
    let value = |tok: u32| global::load16::<f16, 8>(v_cache, head_vectors + tok as usize * (HEAD_DIM / 8));
    attend(&mut state, qs, len * rank / blocks, len * (rank + 1) / blocks, key, value);
    let merged = merge(state);
    if rank == 0 && t < HEAD_DIM {
        attn.set(head * HEAD_DIM + t, merged.load(t) / merged.load(HEAD_DIM));
    }
}

/// Separate 5/5: `out = x + W_o · attn`; grid `hidden / 32` blocks of 256.
#[kernel(launch_bounds(max_threads = 256))]
pub fn decode_o_proj(attn: &[f32], w_o: &[f16], x: &[f16], out: Out<f16>) {
    gemv(w_o, attn, |row, y| out.set(row, f16::from_f32(x[row].to_f32() + y)));
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host {
    //! One decode step on the host: random inputs, the f64 reference, device buffers, and
    //! both variants' launches.

    use super::*;
    use crate::check::{with_rng, Report};
    use clusterfuse::host::{Buffer, Gpu, Result};
    use rand::Rng;

    /// One decode step's inputs. Cache tokens `pos ..` start as NaN, so that the new token
    /// must be written and nothing past it read.
    pub struct Step {
        pub hidden: usize,
        pub max_len: usize,
        pub pos: usize,
        pub x: Vec<f16>,
        pub norm_w: Vec<f16>,
        pub w_qkv: Vec<f16>,
        pub w_o: Vec<f16>,
        pub rope: Vec<f32>,
        pub k_cache: Vec<f16>,
        pub v_cache: Vec<f16>,
    }

    /// The step's results: `out`, and the appended k and v (`heads × 128`, as f16 rounds them).
    pub struct Reference {
        pub out: Vec<f64>,
        pub k_new: Vec<f64>,
        pub v_new: Vec<f64>,
    }

    fn uniform(len: usize, lo: f32, hi: f32) -> Vec<f16> {
        with_rng(|rng| (0..len).map(|_| f16::from_f32(rng.random_range(lo..hi))).collect())
    }

    fn round16(v: f64) -> f64 {
        f16::from_f64(v).to_f64()
    }

    /// cos then sin of `pos·θ^(−2i/128)`, `i < 64`, as Hugging Face's Llama computes them.
    pub fn rope(pos: usize) -> Vec<f32> {
        let angles: Vec<f64> = (0..64).map(|i| pos as f64 * THETA.powf(-2.0 * i as f64 / HEAD_DIM as f64)).collect();
        angles.iter().map(|a| a.cos() as f32).chain(angles.iter().map(|a| a.sin() as f32)).collect()
    }

    impl Step {
        /// Fresh random inputs, scaled so that q·k/√128 spreads over a few units and the
        /// attention term of `out` is as large as the residual.
        pub fn random(hidden: usize, max_len: usize, pos: usize) -> Self {
            let heads = hidden / HEAD_DIM;
            let a = 1.0 / (hidden as f32).sqrt();
            let cache = |bound: f32| -> Vec<f16> {
                let mut c = uniform(heads * max_len * HEAD_DIM, -bound, bound);
                for h in 0..heads {
                    c[(h * max_len + pos) * HEAD_DIM..(h + 1) * max_len * HEAD_DIM].fill(f16::NAN);
                }
                c
            };
            Self {
                hidden,
                max_len,
                pos,
                x: uniform(hidden, -0.5, 0.5),
                norm_w: uniform(hidden, 0.5, 1.5),
                w_qkv: uniform(3 * hidden * hidden, -2.4 * a, 2.4 * a),
                w_o: uniform(hidden * hidden, -8.0 * a, 8.0 * a),
                rope: rope(pos),
                k_cache: cache(2.4),
                v_cache: cache(1.0),
            }
        }

        /// The same weights and cache for a step at `pos` (the cache past `pos` stays as it is).
        pub fn set_pos(&mut self, pos: usize) {
            assert!(pos < self.max_len, "pos {pos} is past the cache");
            self.pos = pos;
            self.rope = rope(pos);
        }

        /// Heads.
        pub fn heads(&self) -> usize {
            self.hidden / HEAD_DIM
        }

        /// The whole block in f64 (the appended k and v rounded to f16, as the cache stores them).
        pub fn reference(&self) -> Reference {
            let (h, heads) = (self.hidden, self.heads());
            let f = |v: &f16| v.to_f64();
            let x: Vec<f64> = self.x.iter().map(f).collect();
            let rstd = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / h as f64 + EPS as f64).sqrt();
            let xn: Vec<f64> = x.iter().zip(&self.norm_w).map(|(v, w)| v * rstd * f(w)).collect();
            let qkv: Vec<f64> = self.w_qkv.chunks(h).map(|row| row.iter().zip(&xn).map(|(w, v)| f(w) * v).sum()).collect();
            let rotate = |v: &[f64]| -> Vec<f64> {
                let mut r = vec![0.0; HEAD_DIM];
                for i in 0..64 {
                    let (c, s) = (self.rope[i] as f64, self.rope[64 + i] as f64);
                    r[i] = v[i] * c - v[i + 64] * s;
                    r[i + 64] = v[i + 64] * c + v[i] * s;
                }
                r
            };
            let (mut k_new, mut v_new, mut attn) = (Vec::new(), Vec::new(), Vec::new());
            for head in 0..heads {
                let at = |part: usize| &qkv[part * h + head * HEAD_DIM..part * h + (head + 1) * HEAD_DIM];
                let q = rotate(at(0));
                let k: Vec<f64> = rotate(at(1)).into_iter().map(round16).collect();
                let v: Vec<f64> = at(2).iter().map(|&v| round16(v)).collect();
                let row = |cache: &[f16], t: usize| -> Vec<f64> {
                    cache[(head * self.max_len + t) * HEAD_DIM..][..HEAD_DIM].iter().map(f).collect()
                };
                let mut keys: Vec<Vec<f64>> = (0..self.pos).map(|t| row(&self.k_cache, t)).collect();
                let mut values: Vec<Vec<f64>> = (0..self.pos).map(|t| row(&self.v_cache, t)).collect();
                keys.push(k.clone());
                values.push(v.clone());
                let scores: Vec<f64> = keys.iter().map(|k| k.iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() / (HEAD_DIM as f64).sqrt()).collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let l: f64 = p.iter().sum();
                attn.extend((0..HEAD_DIM).map(|d| p.iter().zip(&values).map(|(p, v)| p * v[d]).sum::<f64>() / l));
                k_new.extend(k);
                v_new.extend(v);
            }
            let out = self.w_o.chunks(h).zip(&x).map(|(row, x)| x + row.iter().zip(&attn).map(|(w, a)| f(w) * a).sum::<f64>()).collect();
            Reference { out, k_new, v_new }
        }
    }

    /// A step's buffers on a device, with both variants' scratch and a poisoned `out`.
    pub struct Buffers {
        pub x: Buffer<f16>,
        pub norm_w: Buffer<f16>,
        pub w_qkv: Buffer<f16>,
        pub w_o: Buffer<f16>,
        pub rope: Buffer<f32>,
        pub k_cache: Buffer<f16>,
        pub v_cache: Buffer<f16>,
        pub out: Buffer<f16>,
        partials: Buffer<f32>,
        arrivals: Buffer<u32>,
        xn: Buffer<f32>,
        qkv: Buffer<f32>,
        q: Buffer<f32>,
        attn: Buffer<f32>,
    }

    impl Buffers {
        /// Uploads `step`; `arrivals` is zeroed once here, and every fused launch leaves it zero.
        pub fn upload(gpu: &Gpu, step: &Step) -> Result<Self> {
            let h = step.hidden;
            Ok(Self {
                x: gpu.upload(&step.x)?,
                norm_w: gpu.upload(&step.norm_w)?,
                w_qkv: gpu.upload(&step.w_qkv)?,
                w_o: gpu.upload(&step.w_o)?,
                rope: gpu.upload(&step.rope)?,
                k_cache: gpu.upload(&step.k_cache)?,
                v_cache: gpu.upload(&step.v_cache)?,
                out: gpu.upload(&vec![f16::NAN; h])?,
                partials: gpu.upload(&vec![f32::NAN; step.heads() * h])?,
                arrivals: gpu.zeros(16)?,
                xn: gpu.upload(&vec![f32::NAN; h])?,
                qkv: gpu.upload(&vec![f32::NAN; 3 * h])?,
                q: gpu.upload(&vec![f32::NAN; h])?,
                attn: gpu.upload(&vec![f32::NAN; h])?,
            })
        }

        /// Poisons `out` again.
        pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
            self.out = gpu.upload(&vec![f16::NAN; self.out.len()])?;
            Ok(())
        }

        /// `out`, then the cache rows written at `pos`, as f32.
        pub fn results(&self, gpu: &Gpu, step: &Step) -> Result<Vec<f32>> {
            let mut values: Vec<f32> = gpu.download(&self.out)?.iter().map(|v| v.to_f32()).collect();
            for cache in [&self.k_cache, &self.v_cache] {
                let cache = gpu.download(cache)?;
                for head in 0..step.heads() {
                    values.extend(cache[(head * step.max_len + step.pos) * HEAD_DIM..][..HEAD_DIM].iter().map(|v| v.to_f32()));
                }
            }
            Ok(values)
        }
    }

    /// Both variants' kernels, loaded.
    pub struct Launchers {
        fused: decode_attention::Kernel,
        rms_norm: decode_rms_norm::Kernel,
        qkv: decode_qkv::Kernel,
        rope_append: decode_rope_append::Kernel,
        attend: decode_attend::Kernel,
        o_proj: decode_o_proj::Kernel,
    }

    fn config(grid: usize, block: u32, cluster: Option<u32>, dynamic_smem_bytes: usize) -> LaunchConfig {
        LaunchConfig { grid: (grid as u32).into(), block: block.into(), cluster: cluster.map(Into::into), dynamic_smem_bytes: dynamic_smem_bytes as u32 }
    }

    impl Launchers {
        pub fn load(gpu: &Gpu) -> Result<Self> {
            Ok(Self {
                fused: decode_attention::load(gpu)?,
                rms_norm: decode_rms_norm::load(gpu)?,
                qkv: decode_qkv::load(gpu)?,
                rope_append: decode_rope_append::load(gpu)?,
                attend: decode_attend::load(gpu)?,
                o_proj: decode_o_proj::load(gpu)?,
            })
        }

        /// The fused kernel with clusters of `cluster` blocks (`hidden / cluster ≤ MAX_SLICE`).
        pub fn fused(&self, gpu: &Gpu, b: &mut Buffers, step: &Step, cluster: u32) -> Result<()> {
            assert!(step.hidden / cluster as usize <= MAX_SLICE && step.hidden.is_multiple_of(8 * cluster as usize), "cluster {cluster} does not fit hidden {}", step.hidden);
            let c = config(step.heads() * cluster as usize, BLOCK, Some(cluster), 0);
            self.fused.launch(gpu.stream(), &c, &b.x, &b.norm_w, &b.w_qkv, &b.w_o, &b.rope, &mut b.k_cache, &mut b.v_cache,
                              &mut b.partials, &mut b.arrivals, &mut b.out, step.pos as u32, step.max_len as u32)
        }

        /// Most clusters of `cluster` blocks of the fused kernel resident at once (its grid
        /// has `heads` of them).
        pub fn fused_max_active_clusters(&self, gpu: &Gpu, step: &Step, cluster: u32) -> Result<u32> {
            let plan = self.fused.raw().plan(&config(step.heads() * cluster as usize, BLOCK, Some(cluster), 0))?;
            self.fused.raw().max_active_clusters(gpu.stream(), &plan)
        }

        /// The five separate kernels, the attention with clusters of `cluster` blocks.
        pub fn separate(&self, gpu: &Gpu, b: &mut Buffers, step: &Step, cluster: u32) -> Result<()> {
            let (s, h) = (gpu.stream(), step.hidden);
            let rows_per_block = WARPS * QKV_ROWS;
            self.rms_norm.launch(s, &config(1, BLOCK, None, 0), &b.x, &b.norm_w, &mut b.xn)?;
            self.qkv.launch(s, &config(3 * h / rows_per_block, BLOCK, None, 4 * h), &b.xn, &b.w_qkv, &mut b.qkv)?;
            self.rope_append.launch(s, &config(step.heads(), HEAD_DIM as u32, None, 0), &b.qkv, &b.rope, &mut b.q, &mut b.k_cache,
                                    &mut b.v_cache, step.pos as u32, step.max_len as u32)?;
            self.attend.launch(s, &config(step.heads() * cluster as usize, BLOCK, Some(cluster), 0), &b.q, &b.k_cache, &b.v_cache,
                               &mut b.attn, step.pos as u32 + 1, step.max_len as u32)?;
            self.o_proj.launch(s, &config(h / rows_per_block, BLOCK, None, 4 * h), &b.attn, &b.w_o, &b.x, &mut b.out)
        }
    }

    /// Runs both variants on fresh steps at several positions (the fused kernel's arrival
    /// counters carried from one launch to the next) and compares `out` and the appended
    /// k, v with the f64 reference.
    pub fn run(gpu: &Gpu) -> Result<Report> {
        let launchers = Launchers::load(gpu)?;
        let (hidden, max_len, clusters) = crate::check::shape(gpu, (4096, 1040, [8, 16]), (256, 320, [2, 4]));
        let positions = [0, 1, 77, max_len - 21];
        let (mut outs, mut refs) = (Vec::new(), Vec::new());
        let mut arrivals = None;
        for (i, &pos) in positions.iter().enumerate() {
            let step = Step::random(hidden, max_len, pos);
            let reference = step.reference();
            let expected = || reference.out.iter().chain(&reference.k_new).chain(&reference.v_new).copied();
            let cluster = clusters[i % 2];
            let mut b = Buffers::upload(gpu, &step)?;
            if let Some(carried) = arrivals.take() {
                b.arrivals = carried;
            }
            launchers.fused(gpu, &mut b, &step, cluster)?;
            outs.extend(b.results(gpu, &step)?);
            refs.extend(expected());
            arrivals = Some(b.arrivals);

            let mut b = Buffers::upload(gpu, &step)?;
            launchers.separate(gpu, &mut b, &step, cluster)?;
            outs.extend(b.results(gpu, &step)?);
            refs.extend(expected());
        }
        let shape = format!("hidden {hidden}, pos {positions:?}, clusters {clusters:?}");
        Ok(Report::new(shape, &outs, &refs, 2e-3))
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::run;
