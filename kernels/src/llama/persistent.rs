//! The Llama decode step of [`super::chain`] as **one persistent launch**: every block of
//! the grid resident (two per SM), looping over the step's work instead of ending at 82 kernel
//! boundaries, and waiting on exactly the data it reads instead of on whole grids.
//!
//! The stages are the chain's own device code ([`project`], [`attend`]); what changes is how
//! they meet. Each activation is a [`Published`] buffer: a block that writes a tile publishes
//! it (release), a block that reads tiles waits for them (acquire) and gets back a view of
//! exactly those tiles, its only way to read them. The kernel is `#[kernel(persistent)]`, so
//! its launch fails with `Error::NotCoResident` unless the GPU holds the whole grid at once,
//! and the CPU emulator runs its blocks interleaved, reporting a wait nothing will satisfy as
//! a deadlock naming the flag. Every tile is published once per launch: the residual stream
//! takes a region per version (`2 · layers + 1` of them), `q`, the new keys and values, the
//! attention output and the MLP activation one per layer, so no block overwrites what another
//! may still read.
//!
//! The schedule is static: every block runs the stages in step order, taking the items of
//! each round robin ([`grid::round_robin`]; the attention's tasks go to whole clusters,
//! [`grid::cluster_round_robin`]). A block that finishes its items of one stage goes on to the
//! next stage's first item and issues its weight loads at once, before it waits for that
//! stage's input: the next matrix streams while the current one drains, inside one launch.
//! Every wait is on an earlier stage, and every block finishes a stage's items before it waits
//! in the next, so the schedule cannot deadlock on a co-resident grid.
//!
//! Per layer (`l`), with `h[r]` the residual stream's version `r`:
//! 1. QKV (RMSNorm, projection, RoPE): waits for all of `h[2l]`; publishes `q` and the new
//!    `k, v` (bf16) in tiles of 8 values, each item's as it completes;
//! 2. attention, a task per KV head on a cluster: waits for its heads' `q` and its `k, v`
//!    tiles, appends the new token to the caches, flash-decodes (the chain's merge over the
//!    cluster), publishes its heads' output;
//! 3. `h[2l+1] = h[2l] + W_o · attn`: waits for all of `attn`, each residual value alone;
//! 4. gate/up (RMSNorm, SiLU·up): waits for all of `h[2l+1]`, publishes `act`;
//! 5. `h[2l+2] = h[2l+1] + W_down · act`: waits for all of `act`.
//!
//! then the LM head on `h[2·layers]`; before the first layer, `h[0]`, the token's embedding.

use super::chain::{attend, cache_vector, head_rows, pairs_per_block, project, qkv_rows, rope_factors, rotate, silu_gate, Vector, BLOCK, HEAD_DIM};
use clusterfuse::prelude::*;
use core::ops::Range;

/// Values per tile of the residual stream: the rows of a down projection's item (two pairs).
pub const H_TILE: u32 = 4;
/// Values per tile of `q` and of the new keys and values: the 8 rows a QKV item writes of
/// each half of a head.
pub const QKV_TILE: u32 = 8;
/// Values per tile of the attention output: a query head.
pub const ATTN_TILE: u32 = HEAD_DIM as u32;
/// Values per tile of the MLP activation: a gate/up item's 8 rows.
pub const ACT_TILE: u32 = 8;

/// `w`'s `l`-th block of `len` values (a layer's matrix of weights stacked over the layers).
#[inline(always)]
fn layer(w: &[bf16], l: usize, len: usize) -> &[bf16] {
    &w[l * len..(l + 1) * len]
}

/// Eight bf16 values as the four words [`attend`] takes.
#[inline(always)]
fn words(v: [bf16; 8]) -> Vector {
    // SAFETY: eight 2-byte plain values are 16 bytes, as four words are.
    unsafe { core::mem::transmute::<[bf16; 8], Vector>(v) }
}

/// The whole decode step. Weights are stacked over the layers (`norm1`: layers × hidden,
/// `w_qkv`: layers × qkv rows × hidden, ...), caches `layers × kv heads × max_len × 64`.
/// `h`: `2 · layers + 1` versions of the residual stream; `q`, `attn`: layers × hidden; `kv`:
/// layers × (k rows, then v rows); `act`: layers × MLP width. Grid: every block resident
/// (`host::config`), clusters of up to 16, blocks of [`BLOCK`], `stage_bytes(MLP width)` of
/// dynamic shared memory.
///
/// Each stage is a function of its own, not inlined: the kernel's many buffers stay out of
/// the registers of the stages' loops (which keep 16 weight vectors a lane in flight), at the
/// price of saving them once per stage.
#[kernel(persistent, launch_bounds(max_threads = 256, min_blocks = 2))]
#[allow(clippy::too_many_arguments)]
pub fn llama_step(
    embedding: &[bf16],
    token: &[u32],
    position: &[u32],
    rope: &[f32],
    norm1: &[bf16],
    w_qkv: &[bf16],
    w_o: &[bf16],
    norm2: &[bf16],
    w_gate_up: &[bf16],
    w_down: &[bf16],
    final_norm: &[bf16],
    k_cache: Out<bf16>,
    v_cache: Out<bf16>,
    h: Published<f32>,
    q: Published<f32>,
    kv: Published<bf16>,
    attn: Published<f32>,
    act: Published<f32>,
    logits: Out<f32>,
    timeline: Out<u64>,
    max_len: u32,
) {
    let hidden = final_norm.len();
    let layers = norm1.len() / hidden;
    let (inter, kv_rows) = (act.len() / layers, kv.len() / layers / 2);
    let d = Dims { hidden, kv_rows, max_len: max_len as usize, pos: position[0] as usize };
    let qkv_outputs = hidden + 2 * kv_rows;
    let version = |r: usize| r * hidden..(r + 1) * hidden;
    let timeline = Timeline(&timeline);
    // Each stage's tasks go round robin from the block after the previous stage's last task,
    // so that the blocks done first with one stage start the next.
    let (blocks, cluster) = (grid::dim().x as usize, cluster::size() as usize);
    let mut next = 0usize;
    // `tasks` tasks of `width` blocks each, from the first block after the last stage's
    // that starts such a task (a cluster's first block, for cluster tasks).
    let mut after = |tasks: usize, width: usize| {
        let first = next.next_multiple_of(width) % blocks;
        next = (first + tasks * width) % blocks;
        first as u32 / width as u32
    };
    let items = |pairs: usize, k: usize| pairs.div_ceil(pairs_per_block(k));
    let kv_heads = kv_rows / HEAD_DIM;

    // h[0]: the token's embedding row, widened, in tasks of a block's width.
    timeline.stamp(0, START);
    let row = token[0] as usize * hidden;
    let t = thread::rank_in_block() as usize;
    let tasks = hidden / BLOCK as usize;
    for task in grid::round_robin(tasks as u32, after(tasks, 1)) {
        let values = task as usize * BLOCK as usize..(task as usize + 1) * BLOCK as usize;
        h.set(values.start + t, embedding[row + values.start + t].to_f32());
        h.publish(h.tiles_of(values));
    }
    timeline.stamp(0, END);
    for l in 0..layers {
        let (h_in, h_mid, h_out) = (version(2 * l), version(2 * l + 1), version(2 * l + 2));
        let act_l = l * inter..(l + 1) * inter;
        let stage = |s: usize| (&timeline, 1 + STAGES * l + s);
        timeline.stamp(stage(0).1, START);
        let first = after(items(qkv_outputs / 2, hidden), 1);
        qkv(d, l, stage(0), first, &h, h_in.clone(), layer(norm1, l, hidden), layer(w_qkv, l, qkv_outputs * hidden), rope, &q, &kv);
        timeline.stamp(stage(0).1, END);
        timeline.stamp(stage(1).1, START);
        let first = after(kv_heads, cluster);
        attention(d, l, stage(1), first, &q, &kv, &attn, &k_cache, &v_cache);
        timeline.stamp(stage(1).1, END);
        timeline.stamp(stage(2).1, START);
        let first = after(items(hidden / 2, hidden), 1);
        residual(stage(2), first, &attn, version(l), layer(w_o, l, hidden * hidden), &h, h_in.start, h_mid.start);
        timeline.stamp(stage(2).1, END);
        timeline.stamp(stage(3).1, START);
        let first = after(items(inter, hidden), 1);
        gate_up(stage(3), first, &h, h_mid.clone(), layer(norm2, l, hidden), layer(w_gate_up, l, 2 * inter * hidden), &act, act_l.start);
        timeline.stamp(stage(3).1, END);
        timeline.stamp(stage(4).1, START);
        let first = after(items(hidden / 2, inter), 1);
        residual(stage(4), first, &act, act_l, layer(w_down, l, hidden * inter), &h, h_mid.start, h_out.start);
        timeline.stamp(stage(4).1, END);
    }
    let last = 1 + STAGES * layers;
    timeline.stamp(last, START);
    let first = after(0, 1);
    lm_head((&timeline, last), first, &h, version(2 * layers), final_norm, embedding, &logits);
    timeline.stamp(last, END);
}

/// Stages of a layer: QKV, attention, W_o, gate/up, down.
pub const STAGES: usize = 5;
/// A stage's stamps: its start, its input ready (in blocks that had work in it), its end.
pub const START: usize = 0;
pub const READY: usize = 1;
pub const END: usize = 2;

/// Per block, `%globaltimer` at each stage's start, once its input is ready, and at its end
/// (stage 0 the embedding, then [`STAGES`] a layer, then the LM head): `blocks × stages × 3`
/// values, or one (then nothing is stamped).
struct Timeline<'a>(&'a Out<'a, u64>);

/// A stage's place in the timeline.
type Stamp<'a> = (&'a Timeline<'a>, usize);

impl Timeline<'_> {
    #[inline(always)]
    fn stamp(&self, stage: usize, point: usize) {
        if self.0.len() > 1 && thread::rank_in_block() == 0 {
            let stages = self.0.len() / grid::dim().x as usize / 3;
            self.0.set((block::index_x() as usize * stages + stage) * 3 + point, clusterfuse::arch::globaltimer());
        }
    }
}

/// `ready` from the caller's point of view: the input, once stamped as ready.
#[inline(always)]
fn stamped<R>((timeline, stage): Stamp<'_>, ready: R) -> R {
    timeline.stamp(stage, READY);
    ready
}

/// The model's dimensions and the step's position, as the kernel derives them.
#[derive(Clone, Copy)]
struct Dims {
    hidden: usize,
    /// Key (or value) rows per layer: KV heads × 64.
    kv_rows: usize,
    max_len: usize,
    pos: usize,
}

/// Stage 1, QKV of layer `l`, as `llama_qkv` (pairs `(r, r + 32)` of a head's rows) from elements
/// `x` of the residual stream `h`: publishes `q` and the new `k, v` as each item completes.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn qkv(d: Dims, l: usize, at: Stamp<'_>, first: u32, h: &Published<f32>, x: Range<usize>, norm: &[bf16], w: &[bf16], rope: &[f32], q: &Published<f32>, kv: &Published<bf16>) {
    let Dims { hidden, kv_rows, pos, .. } = d;
    let (q_at, kv_at) = (l * hidden, l * 2 * kv_rows);
    let epilogue = |p: usize, [a, b]: [f32; 2], rstd: f32, factors: (f32, f32)| {
        let (base, i) = head_rows(p);
        let (a, b) = (a * rstd, b * rstd);
        let (lo, hi) = rotate(a, b, factors);
        if base < hidden {
            q.set(q_at + base + i, lo);
            q.set(q_at + base + i + HEAD_DIM / 2, hi);
        } else {
            // k rows rotate, v rows do not; both go to `kv` in the projection's order.
            let (lo, hi) = if base < hidden + kv_rows { (lo, hi) } else { (a, b) };
            kv.set(kv_at + base - hidden + i, bf16::from_f32(lo));
            kv.set(kv_at + base - hidden + i + HEAD_DIM / 2, bf16::from_f32(hi));
        }
    };
    // An item's pairs lie in one head: two runs of rows, one in each half.
    let done = |pairs: Range<usize>| {
        let (base, i) = head_rows(pairs.start);
        for half in [0, HEAD_DIM / 2] {
            let first = base + half + i;
            if base < hidden {
                q.publish(q.tiles_of(q_at + first..q_at + first + pairs.len()));
            } else {
                let first = kv_at + first - hidden;
                kv.publish(kv.tiles_of(first..first + pairs.len()));
            }
        }
    };
    project(|| stamped(at, h.wait(x.clone())), x.clone(), Some(norm), w, (hidden + 2 * kv_rows) / 2, qkv_rows, |p| rope_factors(rope, pos, p), |_, e| e, epilogue, done, first);
}

/// Stage 2, the attention of layer `l`: a KV head per cluster task, its query heads' and its new
/// key's and value's tiles waited for; the new token joins the caches; the heads' output is
/// published.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn attention(d: Dims, l: usize, at: Stamp<'_>, first: u32, q: &Published<f32>, kv: &Published<bf16>, attn: &Published<f32>, k_cache: &Out<bf16>, v_cache: &Out<bf16>) {
    let Dims { hidden, kv_rows, max_len, pos, .. } = d;
    let kv_heads = kv_rows / HEAD_DIM;
    let group_size = hidden / HEAD_DIM / kv_heads;
    let (q_at, kv_at) = (l * hidden, l * 2 * kv_rows);
    let (rank, t) = (cluster::block_rank(), thread::rank_in_block() as usize);
    for kv_head in grid::cluster_round_robin(kv_heads as u32, first) {
        let kv_head = kv_head as usize;
        let heads = q_at + kv_head * group_size * HEAD_DIM..q_at + (kv_head + 1) * group_size * HEAD_DIM;
        let (k_new, v_new) = (kv_at + kv_head * HEAD_DIM, kv_at + kv_rows + kv_head * HEAD_DIM);
        let cache_head = l * kv_heads + kv_head;
        let ready = || {
            let queries = q.wait(heads.clone());
            let (keys, values) = (kv.wait(k_new..k_new + HEAD_DIM), kv.wait(v_new..v_new + HEAD_DIM));
            // The new token joins the caches here (the step reads only the tokens before it).
            if rank == 0 && t < HEAD_DIM / 8 {
                let at = cache_vector(cache_head, max_len, pos, t);
                k_cache.store16(at, keys.load16::<8>(k_new / 8 + t));
                v_cache.store16(at, values.load16::<8>(v_new / 8 + t));
            }
            let new_token = move |lane8: usize| (words(keys.load16::<8>(k_new / 8 + lane8)), words(values.load16::<8>(v_new / 8 + lane8)));
            stamped(at, (queries, heads.start, new_token))
        };
        attend(k_cache, v_cache, cache_head, max_len, pos, group_size, ready, |i, value| attn.set(heads.start + i, value));
        if rank == 0 {
            attn.publish(attn.tiles_of(heads.clone()));
        }
    }
}

/// Stages 3 and 5, `h[to..] = h[from..] + w · x` for the elements `x_at` of `x` (the attention
/// output or the MLP activation); each residual value is waited for alone.
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn residual(at: Stamp<'_>, first: u32, x: &Published<f32>, x_at: Range<usize>, w: &[bf16], h: &Published<f32>, from: usize, to: usize) {
    let hidden = w.len() / x_at.len();
    let late = |p: usize, ()| [h.get(from + 2 * p), h.get(from + 2 * p + 1)];
    let epilogue = |p: usize, [a, b]: [f32; 2], _, old: [f32; 2]| {
        h.set(to + 2 * p, old[0] + a);
        h.set(to + 2 * p + 1, old[1] + b);
    };
    let done = |pairs: Range<usize>| h.publish(h.tiles_of(to + 2 * pairs.start..to + 2 * pairs.end));
    project(|| stamped(at, x.wait(x_at.clone())), x_at.clone(), None, w, hidden / 2, |p| (2 * p, 2 * p + 1), |_| (), late, epilogue, done, first);
}

/// Stage 4, `act[act_at..] = silu(gate) · up` of RMSNorm(elements `x` of `h`).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn gate_up(at: Stamp<'_>, first: u32, h: &Published<f32>, x: Range<usize>, norm: &[bf16], w: &[bf16], act: &Published<f32>, act_at: usize) {
    let inter = w.len() / x.len() / 2;
    let epilogue = |p: usize, [gate, up]: [f32; 2], rstd: f32, ()| act.set(act_at + p, silu_gate(gate * rstd, up * rstd));
    let done = |pairs: Range<usize>| act.publish(act.tiles_of(act_at + pairs.start..act_at + pairs.end));
    project(|| stamped(at, h.wait(x.clone())), x.clone(), Some(norm), w, inter, |p| (p, inter + p), |_| (), |_, ()| (), epilogue, done, first);
}

/// The LM head on elements `x` of `h`, the last version.
#[inline(never)]
fn lm_head(at: Stamp<'_>, first: u32, h: &Published<f32>, x: Range<usize>, norm: &[bf16], embedding: &[bf16], logits: &Out<f32>) {
    project(|| stamped(at, h.wait(x.clone())), x.clone(), Some(norm), embedding, logits.len() / 2, |p| (2 * p, 2 * p + 1), |_| (), |_, ()| (), |p, [a, b], rstd, ()| {
        logits.set(2 * p, a * rstd);
        logits.set(2 * p + 1, b * rstd);
    }, |_| (), first);
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
