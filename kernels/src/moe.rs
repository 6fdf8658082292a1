//! A mixture-of-experts layer at decode: router, top-k routing, and SiLU-gated expert FFNs
//! over only the experts the batch selects, bf16 weights and activations, f32 arithmetic on
//! tensor cores, 1-64 tokens, in two launches:
//!
//! `y[t] = Σ_{e ∈ topk(t)} g[t, e] · W_down[e] · (silu(W_gate[e] · x[t]) ⊙ W_up[e] · x[t])`
//!
//! with `g` the softmax of the router logits `W_router · x[t]` (over all experts, or over the
//! top k alone with `renormalize`: Mixtral's gating, where the two are the same numbers).
//!
//! [`fn@moe_gate_up_g8`] (and `_g16`, `_g32`, and the `moe_gate_up_staged_` forms; clusters
//! of `C` blocks, as many as fit on the GPU at once):
//! 1. **Routing, in every cluster.** Block `r` of a cluster computes the logits of experts
//!    `r·E/C ..` for every token on tensor cores (its router rows against the tokens, the
//!    warps splitting K, each issuing 4 K-steps' loads at once, summed in warp order), and
//!    [`fn@top_k`] — a `#[cluster_primitive]` — finds each token's `k` largest over the whole
//!    cluster through DSMEM: each block's warps find its local top `k` and push them into
//!    every peer's shared memory, then every block merges the `C·k` candidates. Ties go to
//!    the lower expert index (the order is total: a logit and its index form one key), so
//!    every cluster derives the same routing with no grid-wide step: the gate weights, the
//!    tokens each expert serves (a 64-bit mask of tokens, from warp ballots), and the *pairs*
//!    — the `T·k` (token, expert) choices sorted by expert, then token — from a warp's prefix
//!    sums.
//! 2. **Gate and up projections.** A warp owns 16 rows of one selected expert's `W_gate` and
//!    `W_up` and a group of that expert's pairs (an *item*; items go round robin over the
//!    grid's warps, warp `w` of every block before warp `w + 1` of any) and streams the rows
//!    through `mma.m16n8k16` — whole, or, when the items are too few to keep most warps
//!    streaming (DeepSeek's 8 experts at one token), split along K over 2 or 4 warps of a
//!    block, whose sums the first adds in order through shared memory: the weights are the A
//!    operand, loaded in 16-byte vectors straight into fragment registers, the pairs' token
//!    vectors the B operand (8 pairs per n-tile). The experts' weights are stored in 16 × 32
//!    tiles ([`host::tile`]), so that a warp reads 1 KB contiguous per K-step and its rows as
//!    one stream (row-major rows, 64 bytes per row and step, ran at 72% of this speed). A
//!    16-byte load holds 8 consecutive k of one row, not the fragment's k order; the dot
//!    product does not care, so B is loaded with the same permutation (lane `l` reads 8
//!    consecutive k of token `l / 4`) and one pair of loads feeds two `mma`s. Each lane issues
//!    all its weight loads of 4 K-steps (2 with 4 n-tiles) before its `mma`s. With groups of
//!    8 pairs all of `x` is copied into shared memory (`cp.async`, before the routing) and B
//!    read from there as each `mma` needs it, so that registers hold only the weights in
//!    flight; with 16 or 32, B comes from L2 with the weights. The **staged** kernels
//!    ([`host::Schedule::Staged`]) give a block's 8 warps 8 row tiles of one item instead (4
//!    with groups of 32, each pair of warps splitting the pairs) and copy the item's pairs'
//!    `x` into shared memory a window of 1024 columns at a time, so
//!    that each pair's vector crosses from L2 once a block, not once a warp — the same sums
//!    in the same order. The epilogue writes `h = silu(gate) ⊙ up` (bf16) per pair, in pair
//!    order.
//!
//! [`fn@moe_down_g8`] (and `_g16`; launched programmatically after it; a cluster per 16 rows of
//! the output, whose 1-4 blocks split K): the cluster's warps split the flat list of
//! (item, 32-wide K-step) units of the selected experts' `W_down` rows into contiguous
//! ranges; each warp streams its range (6 or 3 steps' loads in flight with groups of 8 or 16
//! pairs), multiplies it with the pairs' `h`, and adds each run inside one item times its
//! pairs' gate weights into its own per-token accumulators in shared memory; the
//! block sums its warps' accumulators in warp order, `cluster::reduce` the blocks' in rank
//! order, and the blocks write `y`. Its staged form ([`fn@moe_down_staged_g8`], `_g16`) gives
//! a cluster 128 output rows instead, a row tile a warp, its blocks splitting the units, and
//! copies each run's `h` into shared memory 24 K-steps at a time, so that `h` crosses from L2
//! once per 128 rows, not once per 16. The combine is fused into the last projection, and
//! nothing is atomic: the output is bitwise deterministic.
//!
//! Every weight byte of a selected expert is read from memory once per step (a warp's rows
//! are read again only when an expert serves more pairs than its group holds: 8, 16 or 32
//! pairs per group for the `_g8`, `_g16`, `_g32` kernels — the down kernel's at most 16 —
//! chosen by [`host::plan`] at about twice the pairs an expert serves on average), and
//! unselected experts are never touched.
//!
//! ```no_run
//! # fn main() -> clusterfuse::host::Result<()> {
//! use clusterfuse::host::Gpu;
//! use clusterfuse_kernels::moe::host::{plan, step, Buffers, Kernels, Layer, Moe};
//!
//! let gpu = Gpu::new(0)?;
//! let moe = Moe::random(Layer::MIXTRAL_8X7B, 8, 42)?; // 8 tokens, seed 42
//! let kernels = Kernels::load(&gpu)?;
//! let mut buffers = Buffers::upload(&gpu, &moe)?; // tiles the expert weights
//! let plan = plan(&kernels, &gpu, moe.layer, moe.tokens, 4, true)?; // clusters of 4, PDL
//! step(&kernels, gpu.stream(), &mut buffers, &plan)?;
//! let (y, experts, gates) = buffers.results(&gpu)?;
//! # let _ = (y, experts, gates); Ok(()) }
//! ```

use clusterfuse::arch;
use clusterfuse::cluster::Cluster;
use clusterfuse::mma::{mma_m16n8k16, FragA, FragB, FragC};
use clusterfuse::ops::{rank_key, rank_unkey};
use clusterfuse::prelude::*;
use clusterfuse::shared::DynamicShared;
use crate::decode::load_words_out;

/// Most tokens a launch routes (a token mask is 64 bits).
pub const MAX_TOKENS: usize = 64;
/// Most experts a token chooses.
pub const MAX_TOP_K: usize = 8;
/// Threads per block.
pub const BLOCK: u32 = 256;
const WARPS: usize = BLOCK as usize / 32;
/// Rows of an item: the rows of an `mma` tile.
pub const ROWS: usize = 16;
/// Columns (k) one `mma` step of a lane group covers: two `m16n8k16`.
const STEP: usize = 32;
/// K-steps whose loads the gate/up kernel issues together (half as many with 4 n-tiles).
const GATE_UP_UNROLL: usize = 4;
/// K-steps of a warp whose router loads the routing issues together.
const ROUTER_UNROLL: usize = 4;
/// K-steps whose loads the down kernel issues together, times its n-tiles (8 spills 800
/// bytes at 128 registers).
const DOWN_UNROLL: usize = 6;

/// The `k` largest of `len` keys (`key_at(i)`), largest first: `emit(j, key)` in every lane
/// for round `j` (0 once the keys run out). The whole warp calls it together.
#[inline(always)]
fn warp_top_k(len: usize, k: usize, key_at: impl Fn(usize) -> u64, mut emit: impl FnMut(usize, u64)) {
    let mut bound = u64::MAX;
    for j in 0..k {
        let mut best = 0;
        for i in (warp::lane() as usize..len).step_by(32) {
            let key = key_at(i);
            if key < bound && key > best {
                best = key;
            }
        }
        bound = warp::reduce_max_u64(best);
        emit(j, bound);
    }
}

/// Each row's `k` largest values over the cluster, as [`rank_key`]s, largest first, in `top`
/// (`rows × k`) of every block: block `r` holds columns `r·n .. (r + 1)·n` of each row in
/// `values` (`rows × n`, row-major), and a key's index is its column in the whole row. Ties
/// go to the lower index. `candidates` (at least `rows × cluster::size() × k`) is the
/// exchange buffer; `k ≤ 32` and `cluster::size() ≤ 32`. Every thread of every block calls
/// it, after the block has written `values`; `top` is ready in every thread on return.
///
/// Each warp takes rows round robin, finds the row's local top `k` in rounds of
/// [`warp::reduce_max_u64`] and lane `p` pushes it into block `p`'s `candidates` (after the
/// first barrier: a peer's shared memory exists only once it has started); after the second,
/// each warp merges a row's `size · k` candidates the same way; the third lets `candidates`
/// be reused.
#[cluster_primitive(barriers = 3)]
pub fn top_k(_scope: &Cluster, values: SharedSlice<f32>, rows: usize, k: usize, candidates: SharedSlice<u64>, top: SharedSlice<u64>) {
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    if k > 32 || size > 32 || rows == 0 || candidates.len() < rows * size * k || top.len() < rows * k {
        arch::trap();
    }
    let n = values.len() / rows;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let warps = block::warps() as usize;
    cluster::sync();
    for row in (warp..rows).step_by(warps) {
        let key_at = |i: usize| rank_key(values.load(row * n + i), (rank * n + i) as u32);
        warp_top_k(n, k, key_at, |j, best| {
            if lane < size {
                candidates.in_block(lane as u32).store((row * size + rank) * k + j, best);
            }
        });
    }
    cluster::sync();
    for row in (warp..rows).step_by(warps) {
        warp_top_k(size * k, k, |i| candidates.load(row * size * k + i), |j, best| {
            if lane == 0 {
                top.store(row * k + j, best);
            }
        });
    }
    cluster::sync();
}

/// The routing of a launch, in a block's shared memory: per expert the number of pairs it
/// serves and the first of them, the pairs' tokens and gate weights (sorted by expert, then
/// token), and the *items*: `(expert << 16) | group` for each group of up to `group` pairs of
/// an expert, in expert order, after their count at index 0.
#[derive(Clone, Copy)]
struct Dispatch {
    count: SharedSlice<u32>,
    offset: SharedSlice<u32>,
    pair_token: SharedSlice<u32>,
    pair_gate: SharedSlice<f32>,
    items: SharedSlice<u32>,
}

/// One item: an expert, and its pairs `first .. first + len`.
#[derive(Clone, Copy)]
struct Item {
    expert: usize,
    first: usize,
    len: usize,
}

impl Dispatch {
    fn take(smem: &mut DynamicShared, experts: usize, pairs: usize) -> Self {
        Dispatch {
            count: smem.take(experts),
            offset: smem.take(experts),
            pair_token: smem.take(pairs),
            pair_gate: smem.take(pairs),
            items: smem.take(pairs + 1),
        }
    }

    /// From `count`: `offset` (exclusive prefix sums) and the item list for groups of
    /// `group` pairs, by warp 0's prefix sums (a lane per run of experts); then a block
    /// barrier.
    fn list_items(self, group: usize) {
        if warp::index_in_block() == 0 {
            let experts = self.count.len();
            let lane = warp::lane() as usize;
            let per = experts.div_ceil(32);
            let mine = (lane * per).min(experts)..((lane + 1) * per).min(experts);
            let (mut pairs, mut items) = (0u32, 0u32);
            for e in mine.clone() {
                let c = self.count.load(e);
                (pairs, items) = (pairs + c, items + c.div_ceil(group as u32));
            }
            let (mut pair, mut item) = (exclusive_sum(pairs), exclusive_sum(items));
            for e in mine {
                let c = self.count.load(e);
                self.offset.store(e, pair);
                for g in 0..c.div_ceil(group as u32) {
                    self.items.store(1 + item as usize, ((e as u32) << 16) | g);
                    item += 1;
                }
                pair += c;
            }
            if lane == 31 {
                self.items.store(0, item);
            }
        }
        block::sync();
    }

    fn items(self) -> usize {
        self.items.load(0) as usize
    }

    /// The down kernels' copy of the routing the gate/up kernel handed over (`routing`: each
    /// expert's pair count, then the pairs' tokens; `pair_gate`), read once it has finished,
    /// and the item list for groups of `group` pairs.
    fn receive(self, routing: &Out<u32>, pair_gate: &Out<f32>, group: usize) {
        let experts = self.count.len();
        grid::wait_for_prerequisites();
        for e in block::stride_loop(0..experts) {
            self.count.store(e, routing.get(e));
        }
        for p in block::stride_loop(0..self.pair_token.len()) {
            self.pair_token.store(p, routing.get(experts + p));
            self.pair_gate.store(p, pair_gate.get(p));
        }
        block::sync();
        self.list_items(group);
    }

    /// Calls `run(item, first..end)` for each run of the (item, K-step) units `units` (unit
    /// `i · steps + s`: step `s` of item `i`, for groups of `group` pairs) inside one item, in
    /// order.
    #[inline(always)]
    fn for_each_run(self, units: core::ops::Range<usize>, steps: usize, group: usize, mut run: impl FnMut(Item, core::ops::Range<usize>)) {
        let mut at = units.start;
        while at < units.end {
            let (i, first) = (at / steps, at % steps);
            let end = first + (units.end - at).min(steps - first);
            run(self.item(i, group), first..end);
            at += end - first;
        }
    }

    /// Adds a warp's `acc` (16 rows × the n-tiles' pairs of `item`, a run of its K-steps) times
    /// each pair's gate weight to the pair's token in `sums` (16 rows × tokens, the warp's
    /// own), then syncs the warp: a lane's cells of a token change with each item's pairs.
    #[inline(always)]
    fn add_run<const NT: usize>(self, acc: &[FragC; NT], item: Item, sums: SharedSlice<f32>) {
        let tokens = sums.len() / ROWS;
        for (n, acc) in acc.iter().enumerate() {
            for v in 0..4 {
                let (r, c) = FragC::position(v);
                let p = 8 * n + c;
                if p < item.len {
                    let cell = r * tokens + self.pair_token.load(item.first + p) as usize;
                    sums.store(cell, sums.load(cell) + self.pair_gate.load(item.first + p) * acc.values[v]);
                }
            }
        }
        warp::sync();
    }

    /// Item `i` for groups of `group` pairs.
    #[inline(always)]
    fn item(self, i: usize, group: usize) -> Item {
        let packed = self.items.load(1 + i) as usize;
        let (expert, g) = (packed >> 16, packed & 0xffff);
        let first = g * group;
        Item { expert, first: self.offset.load(expert) as usize + first, len: (self.count.load(expert) as usize - first).min(group) }
    }
}

/// The exclusive prefix sum of `value` over the warp's lanes (the last lane's inclusive sum
/// is the total).
#[inline(always)]
fn exclusive_sum(value: u32) -> u32 {
    let (lane, mut sum) = (warp::lane(), value);
    for delta in [1, 2, 4, 8, 16] {
        let below = warp::shuffle_up(sum, delta);
        if lane >= delta {
            sum += below;
        }
    }
    sum - value
}

/// Routes `tokens` tokens in every block of the cluster: logits, [`top_k`], gate weights
/// (also returned as `ids`/`gates`, `tokens × k`), the pairs and the item list for groups of
/// `group` pairs. Every thread calls it; the block's shared memory holds the result.
#[allow(clippy::too_many_arguments)]
fn route(smem: &mut DynamicShared, x: &[bf16], router: &[bf16], tokens: usize, k: usize, renormalize: bool, group: usize) -> (Dispatch, SharedSlice<u32>, SharedSlice<f32>) {
    let hidden = x.len() / tokens;
    let experts = router.len() / hidden;
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    let local = experts / size;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let logits = smem.take::<f32>(tokens * local);
    let partials = smem.take::<f32>(WARPS * ROWS * tokens.next_multiple_of(8));
    let denominators = smem.take::<f32>(tokens);
    let candidates = smem.take::<u64>(tokens * size * k);
    let top = smem.take::<u64>(tokens * k);
    let (ids, gates) = (smem.take::<u32>(tokens * k), smem.take::<f32>(tokens * k));
    let masks = smem.take::<u32>(2 * experts);
    let dispatch = Dispatch::take(smem, experts, tokens * k);

    // Logits of this block's experts on tensor cores: A = their router rows (16 a tile,
    // zeros past the last), B = the tokens (8 an n-tile); the warps split the K-steps, and the
    // block sums their tiles in warp order.
    let steps = hidden / STEP;
    let n_tiles = tokens.div_ceil(8);
    for m in (0..local).step_by(ROWS) {
        let row = |r: usize| (m + r < local).then_some(rank * local + m + r);
        let (r0, r8) = (row(lane / 4), row(lane / 4 + 8));
        for n in 0..n_tiles {
            let t = 8 * n + lane / 4;
            let mut acc = FragC::ZERO;
            // The loads of ROUTER_UNROLL of the warp's steps, then their `mma`s: one memory
            // round trip per chunk, not per step, before any weight streams.
            for chunk in (warp..steps).step_by(WARPS * ROUTER_UNROLL) {
                let mut a = [[[0u32; 4]; 2]; ROUTER_UNROLL];
                let mut b = [[0u32; 4]; ROUTER_UNROLL];
                unroll!(u in [0 1 2 3] {
                    let s = chunk + u * WARPS;
                    if s < steps {
                        // SAFETY: rows of the router and of `x` (or none), `s < steps`; both
                        // are inputs.
                        let load = |w: &[bf16], r: Option<usize>| r.map_or([0; 4], |r| unsafe { row_words(w, r, hidden, s) });
                        (a[u], b[u]) = ([load(router, r0), load(router, r8)], load(x, (t < tokens).then_some(t)));
                    }
                });
                unroll!(u in [0 1 2 3] {
                    if chunk + u * WARPS < steps {
                        acc = mma_step(a[u], b[u], acc);
                    }
                });
            }
            for v in 0..4 {
                let (r, c) = FragC::position(v);
                partials.store(((warp * n_tiles + n) * ROWS + r) * 8 + c, acc.values[v]);
            }
        }
        block::sync();
        for i in block::stride_loop(0..ROWS.min(local - m) * tokens) {
            let (r, t) = (i / tokens, i % tokens);
            let sum = (0..WARPS).map(|w| partials.load(((w * n_tiles + t / 8) * ROWS + r) * 8 + t % 8)).sum::<f32>();
            logits.store(t * local + m + r, sum);
        }
        block::sync();
    }
    top_k(&Cluster::new(), logits, tokens, k, candidates, top);

    // Gate weights: exp(l − max) over the top k, or over all experts (each block sums its
    // own, `cluster::reduce` the rest, in rank order).
    if !renormalize {
        for t in block::stride_loop(0..tokens) {
            let max = rank_unkey(top.load(t * k)).0;
            denominators.store(t, (0..local).map(|e| math::exp(logits.load(t * local + e) - max)).sum());
        }
        cluster::reduce(denominators, Sum);
    }
    for t in block::stride_loop(0..tokens) {
        let max = rank_unkey(top.load(t * k)).0;
        let total = if renormalize { (0..k).map(|j| math::exp(rank_unkey(top.load(t * k + j)).0 - max)).sum() } else { denominators.load(t) };
        for j in 0..k {
            let (logit, e) = rank_unkey(top.load(t * k + j));
            ids.store(t * k + j, e);
            gates.store(t * k + j, math::exp(logit - max) / total);
        }
    }
    block::sync();

    // Each expert's tokens, as a 64-bit mask from two ballots (tokens `lane`, `lane + 32`).
    for e in (warp..experts).step_by(WARPS) {
        let chose = |t: usize| t < tokens && (0..k).any(|j| ids.load(t * k + j) == e as u32);
        let (low, high) = (warp::ballot(chose(lane)), warp::ballot(chose(lane + 32)));
        if lane == 0 {
            masks.store(2 * e, low);
            masks.store(2 * e + 1, high);
            dispatch.count.store(e, low.count_ones() + high.count_ones());
        }
    }
    block::sync();
    dispatch.list_items(group);
    // A pair's place: its expert's first pair plus the expert's tokens before it.
    for p in block::stride_loop(0..tokens * k) {
        let (t, e) = (p / k, ids.load(p) as usize);
        let mask = ((masks.load(2 * e + 1) as u64) << 32) | masks.load(2 * e) as u64;
        let at = dispatch.offset.load(e) as usize + (mask & ((1u64 << t) - 1)).count_ones() as usize;
        dispatch.pair_token.store(at, t as u32);
        dispatch.pair_gate.store(at, gates.load(p));
    }
    block::sync();
    (dispatch, ids, gates)
}

/// This lane's 16 bytes of row `row` (`len` columns) of `x` in K-step `s`, as words:
/// columns `32 s + 8 (lane % 4) ..`.
///
/// # Safety
/// 1. `(row + 1) · len <= x.len()`, `len` is a multiple of 32 and `s < len / 32`.
/// 2. No grid writes `x` while the kernel runs, nor one it was launched programmatically after.
/// 3. `x` starts 16-byte aligned (a whole kernel argument: allocations are 256-byte aligned).
#[inline(always)]
unsafe fn row_words(x: &[bf16], row: usize, len: usize, s: usize) -> [u32; 4] {
    global::load16_invariant_unchecked::<u32, 4>(words(x), (row * len + s * STEP) / 8 + warp::lane() as usize % 4)
}

/// This lane's A operand of K-step `s` of row tile `tile` of tiled weights ([`host::tile`]:
/// 16 × 32 tiles of 1 KB, row-major inside, in K order along a row tile, `steps` a row
/// tile): rows `lane / 4` and `lane / 4 + 8`, columns `8 (lane % 4) ..` of the tile — bytes
/// `16 lane ..` and `512 + 16 lane ..`, so that a warp reads each tile as two contiguous
/// 512-byte runs and a row tile as one contiguous stream.
///
/// # Safety
/// 1. `(tile · steps + s + 1) · 512 <= w.len()`.
/// 2. No grid writes `w` while the kernel runs, nor one it was launched programmatically after.
/// 3. `w` starts 16-byte aligned (a whole kernel argument: allocations are 256-byte aligned).
#[inline(always)]
unsafe fn tile_words(w: &[bf16], tile: usize, steps: usize, s: usize) -> [[u32; 4]; 2] {
    let at = (tile * steps + s) * 64 + warp::lane() as usize;
    [global::load16_invariant_unchecked::<u32, 4>(words(w), at), global::load16_invariant_unchecked::<u32, 4>(words(w), at + 32)]
}

/// `w` as words of two halves (an odd length's last half left out).
///
/// # Safety
/// 1. `w` starts 4-byte aligned (a whole kernel argument does).
#[inline(always)]
unsafe fn words(w: &[bf16]) -> &[u32] {
    clusterfuse::packed::words(w)
}

/// `acc + A·B` over one 32-wide K-step: rows `g`, `g + 8` of A are `a[0]`, `a[1]` (8
/// consecutive k each), and the lane's pair column of B is `b` (the same 8 k). The k order
/// inside the step is the loads' own, the same for A and B, so two `mma`s cover it.
#[inline(always)]
fn mma_step(a: [[u32; 4]; 2], b: [u32; 4], acc: FragC) -> FragC {
    let [r, r8] = a;
    let acc = mma_m16n8k16(FragA::<bf16>::from_regs([r[0], r8[0], r[1], r8[1]]), FragB::from_regs([b[0], b[1]]), acc);
    mma_m16n8k16(FragA::<bf16>::from_regs([r[2], r8[2], r[3], r8[3]]), FragB::from_regs([b[2], b[3]]), acc)
}

/// `silu(gate) · up`.
#[inline(always)]
fn silu_gate(gate: f32, up: f32) -> f32 {
    gate * math::rcp(1.0 + math::exp(-gate)) * up
}

/// The gate/up kernel, for groups of `8 · NT` pairs: routing, the hand-over, then the units
/// on one of two schedules — [`gate_up_warps`] (a unit per warp, or split over `split` warps
/// of a block along K), or with `STAGED` [`gate_up_staged`] (a block's warps on 8 row tiles
/// of one item, the item's `x` staged in shared memory; `split` 1).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gate_up<const NT: usize, const STAGED: bool>(
    x: &[bf16],
    router: &[bf16],
    w_gate: &[bf16],
    w_up: &[bf16],
    h: &Out<bf16>,
    routing: &Out<u32>,
    pair_gate: &Out<f32>,
    top_ids: &Out<u32>,
    top_gates: &Out<f32>,
    k: usize,
    renormalize: bool,
    split: usize,
) {
    grid::launch_dependents();
    let tokens = top_ids.len() / k;
    let hidden = x.len() / tokens;
    let ffn = h.len() / (tokens * k);
    let experts = router.len() / hidden;
    if !matches!(split, 1 | 2 | 4) || ((NT > 1 || STAGED) && split > 1) || !hidden.is_multiple_of(STEP * GATE_UP_UNROLL * split) || !ffn.is_multiple_of(ROWS) || w_gate.len() != experts * ffn * hidden || w_up.len() != w_gate.len() {
        arch::trap();
    }
    let group_pairs = 8 * NT;
    let mut smem = shared::dynamic();
    // The warp schedule's B operand with groups of 8 pairs: `x` whole in shared memory (the
    // host plans the staged schedule where it does not fit), its copies started before the
    // routing (`x` is an input) and waited for after it.
    let xs = (!STAGED && NT == 1).then(|| stage_x(&mut smem, x, tokens, hidden));
    let (dispatch, ids, gates) = route(&mut smem, x, router, tokens, k, renormalize, group_pairs);
    if xs.is_some() {
        shared::wait_async_copies();
        block::sync();
    }
    // Cluster 0's first block hands the routing to the down kernel (and the host).
    if cluster::index_in_grid().x == 0 && cluster::block_rank() == 0 {
        for e in block::stride_loop(0..experts) {
            routing.set(e, dispatch.count.load(e));
        }
        for p in block::stride_loop(0..tokens * k) {
            routing.set(experts + p, dispatch.pair_token.load(p));
            pair_gate.set(p, dispatch.pair_gate.load(p));
            top_ids.set(p, ids.load(p));
            top_gates.set(p, gates.load(p));
        }
    }
    let shape = GateUp { x, w_gate, w_up, h, hidden, ffn };
    if STAGED {
        // 32 pairs as two halves of 16 (2 n-tiles a warp).
        if NT == 4 {
            gate_up_staged::<2>(&mut smem, dispatch, &shape, group_pairs);
        } else {
            gate_up_staged::<NT>(&mut smem, dispatch, &shape, group_pairs);
        }
    } else {
        gate_up_warps::<NT>(&mut smem, dispatch, &shape, xs, split);
    }
}

/// The gate/up projections' operands: `x`, the tiled weights, `h`, and the layer's widths.
struct GateUp<'a> {
    x: &'a [bf16],
    w_gate: &'a [bf16],
    w_up: &'a [bf16],
    h: &'a Out<'a, bf16>,
    hidden: usize,
    ffn: usize,
}

impl GateUp<'_> {
    /// `h = silu(gate) ⊙ up` of row tile `row_tile` (of the expert's) for the item's pairs,
    /// from a warp's accumulators.
    #[inline(always)]
    fn write<const NT: usize>(&self, acc: &[[FragC; NT]; 2], item: Item, row_tile: usize) {
        for (n, (gate, up)) in acc[0].iter().zip(&acc[1]).enumerate() {
            for i in 0..4 {
                let (r, c) = FragC::position(i);
                let p = 8 * n + c;
                if p < item.len {
                    let value = silu_gate(gate.values[i], up.values[i]);
                    self.h.set((item.first + p) * self.ffn + row_tile * ROWS + r, bf16::from_f32(value));
                }
            }
        }
    }
}

/// The most shared memory the warp schedule's `x` may take (two blocks an SM with the rest).
const X_SMEM_BYTES: usize = 72 * 1024;

/// Words of shared memory a row of `cols` halves takes when staged: 64 bytes more than the
/// row, so that the 8 lanes of a quarter warp, reading 16 bytes each of two rows, hit 32
/// different banks.
const fn padded_row_words(cols: usize) -> usize {
    cols / 2 + 16
}

/// Bytes of shared memory all of `x` (`tokens × hidden`) takes staged ([`stage_x`]).
const fn x_smem_bytes(tokens: usize, hidden: usize) -> usize {
    tokens * padded_row_words(hidden) * 4
}

/// Whether all of `x` fits the warp schedule's shared memory.
const fn x_fits(tokens: usize, hidden: usize) -> bool {
    x_smem_bytes(tokens, hidden) <= X_SMEM_BYTES
}

/// Starts copying `rows` rows of `pieces` 16-byte vectors of `src` into `dst`, row `p` from
/// vector `first(p)` of `src` to word `p · row_words` of `dst` (`cp.async`, all threads of the
/// block); the caller waits with [`shared::wait_async_copies`] and a block barrier.
#[inline(always)]
fn copy_rows_async(dst: SharedSlice<u32>, row_words: usize, src: &[u32], rows: usize, pieces: usize, first: impl Fn(usize) -> usize) {
    for i in block::stride_loop(0..rows * pieces) {
        let (p, c) = (i / pieces, i % pieces);
        dst.copy16_async::<4>(p * row_words / 4 + c, src, first(p) + c);
    }
}

/// Starts copying `x` (`tokens × hidden`) into shared memory, a [`padded_row_words`] row a
/// token ([`copy_rows_async`]).
fn stage_x(smem: &mut DynamicShared, x: &[bf16], tokens: usize, hidden: usize) -> SharedSlice<u32> {
    let row = padded_row_words(hidden);
    let xs = smem.take::<u32>(tokens * row);
    // SAFETY: `x` is a whole kernel argument.
    copy_rows_async(xs, row, unsafe { words(x) }, tokens, hidden / 8, |t| t * hidden / 8);
    xs
}

/// The gate/up units a warp at a time: each unit (an item's 16 rows) goes to a group of
/// `split` warps of a block (1, 2 or 4, and 1 unless `NT` is 1; more warps in flight when the
/// units are few), each streaming a contiguous `1 / split` of its K-steps. The pairs' `x`
/// comes from `xs` (all of `x` in shared memory, [`stage_x`]: groups of 8) as each `mma`
/// needs it, so that a warp's registers hold only the weights' loads in flight and the
/// accumulators, or else (`None`: groups of 16 and 32) straight from global memory (L2),
/// loaded with the weights.
#[inline(always)]
fn gate_up_warps<const NT: usize>(smem: &mut DynamicShared, dispatch: Dispatch, op: &GateUp, xs: Option<SharedSlice<u32>>, split: usize) {
    let GateUp { x, w_gate, w_up, hidden, ffn, .. } = *op;
    let group_pairs = 8 * NT;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let tiles = ffn / ROWS;
    let steps = hidden / STEP;
    let x_row = padded_row_words(hidden);
    // A unit (16 rows of an item) goes to a group of `split` warps, each taking a contiguous
    // `1 / split` of its K-steps; units go to group `g` of every block before group `g + 1`
    // of any, so that few units still spread over every SM. Every block runs the same rounds,
    // so that the groups' barriers match.
    // (Groups of 8 pairs only: with more n-tiles the accumulators leave no registers for it.)
    let split = if NT == 1 { split } else { 1 };
    let (groups, blocks) = (WARPS / split, grid::dim().x as usize);
    let (group, part, per) = (warp / split, warp % split, steps / split);
    // The other parts' accumulators, for the group's first warp to add: a lane's values
    // `slot · 32 + lane`, so that the warp's accesses hit 32 banks.
    let partials = smem.take::<f32>(groups * (split - 1) * 2 * NT * 4 * 32);
    let units = dispatch.items() * tiles;
    for round in 0..units.div_ceil(blocks * groups) {
        let q = (round * groups + group) * blocks + block::index_x() as usize;
        let item = if q < units { dispatch.item(q / tiles, group_pairs) } else { Item { expert: 0, first: 0, len: 0 } };
        let tile = item.expert * tiles + q % tiles;
        // The lane's pair column in each n-tile: its token's row of `x`, if it has one.
        let x_rows: [Option<usize>; NT] = core::array::from_fn(|n| {
            let p = 8 * n + lane / 4;
            (p < item.len).then(|| dispatch.pair_token.load(item.first + p) as usize)
        });
        let mut acc = [[FragC::ZERO; NT]; 2];
        let unroll = if NT >= 4 { GATE_UP_UNROLL / 2 } else { GATE_UP_UNROLL };
        // A unit past the last streams nothing (`item.len == 0`) but still meets the barriers.
        let mine = if item.len > 0 { part * per..(part + 1) * per } else { 0..0 };
        for chunk in mine.step_by(unroll) {
            let mut a = [[[[0u32; 4]; 2]; 2]; GATE_UP_UNROLL];
            let mut b = [[[0u32; 4]; NT]; GATE_UP_UNROLL];
            unroll!(u in [0 1 2 3] {
                if u < unroll {
                    let s = chunk + u;
                    // SAFETY: `tile` is a row tile of the expert's (checked lengths), and `s <
                    // steps` (`per` is a multiple of the unroll); weights and `x` are inputs.
                    unsafe {
                        a[u] = [tile_words(w_gate, tile, steps, s), tile_words(w_up, tile, steps, s)];
                        if xs.is_none() {
                            for n in 0..NT {
                                if let Some(t) = x_rows[n] {
                                    b[u][n] = row_words(x, t, hidden, s);
                                }
                            }
                        }
                    }
                }
            });
            unroll!(u in [0 1 2 3] {
                if u < unroll {
                    for n in 0..NT {
                        let b = match xs {
                            Some(xs) => x_rows[n].map_or([0; 4], |t| xs.load16::<4>(t * x_row / 4 + (chunk + u) * STEP / 8 + lane % 4)),
                            None => b[u][n],
                        };
                        acc[0][n] = mma_step(a[u][0], b, acc[0][n]);
                        acc[1][n] = mma_step(a[u][1], b, acc[1][n]);
                    }
                }
            });
        }
        if split > 1 {
            // Parts 1.. hand their sums to part 0, which adds them in part order.
            let slot = |p: usize, m: usize, n: usize, v: usize| ((((group * (split - 1) + p - 1) * 2 + m) * NT + n) * 4 + v) * 32 + lane;
            // Unrolled: the accumulators stay in registers only while indexed by constants.
            if part > 0 {
                unroll!(m in [0 1] {
                    unroll!(n in [0 1 2 3] {
                        if n < NT {
                            unroll!(v in [0 1 2 3] {
                                partials.store(slot(part, m, n, v), acc[m][n].values[v]);
                            });
                        }
                    });
                });
            }
            block::sync();
            if part == 0 {
                for p in 1..split {
                    unroll!(m in [0 1] {
                        unroll!(n in [0 1 2 3] {
                            if n < NT {
                                unroll!(v in [0 1 2 3] {
                                    acc[m][n].values[v] += partials.load(slot(p, m, n, v));
                                });
                            }
                        });
                    });
                }
            }
            // The slots are free again once part 0 has read them.
            block::sync();
        }
        if part == 0 {
            op.write(&acc, item, q % tiles);
        }
    }
}


/// K columns of the pairs' `x` a staged gate/up block holds in shared memory at once.
const WINDOW: usize = 1024;

/// Columns of a staged gate/up window: [`WINDOW`], or all of a narrower `hidden`.
const fn window_columns(hidden: usize) -> usize {
    if hidden < WINDOW { hidden } else { WINDOW }
}

/// The gate/up units a block at a time: a *block unit* is row tiles of one item, one a warp
/// (8, or 4 when the item's `group_pairs` are twice a warp's `8 · NT`: then warps `w` and
/// `w + 4` take the same rows and each half of the pairs, so that a warp holds 2 n-tiles'
/// accumulators, not 4, and the rows' second read hits the caches). The block copies the
/// item's pairs' `x` into shared memory a window of [`WINDOW`] columns at a time
/// (`cp.async`, all threads), so that the pairs' vectors cross from L2 once per block unit
/// instead of once per warp, and a warp's registers hold only its weight loads and
/// accumulators; each warp then streams its 16 rows of the window as the warp schedule does,
/// reading B from shared memory. The K order of every sum is the warp schedule's, so the two
/// give the same bits.
#[inline(always)]
fn gate_up_staged<const NT: usize>(smem: &mut DynamicShared, dispatch: Dispatch, op: &GateUp, group_pairs: usize) {
    let GateUp { x, w_gate, w_up, hidden, ffn, .. } = *op;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let (tiles, steps) = (ffn / ROWS, hidden / STEP);
    let row_words = padded_row_words(window_columns(hidden));
    let window_steps = window_columns(hidden) / STEP;
    let staged = smem.take::<u32>(group_pairs * row_words);
    let unit_tiles = WARPS / (group_pairs / (8 * NT));
    let (slot, half) = (warp % unit_tiles, warp / unit_tiles);
    // SAFETY: `x` is a whole kernel argument.
    let x_words = unsafe { words(x) };
    let per_item = tiles.div_ceil(unit_tiles);
    let units = dispatch.items() * per_item;
    for unit in (block::index_x() as usize..units).step_by(grid::dim().x as usize) {
        let item = dispatch.item(unit / per_item, group_pairs);
        let row_tile = unit % per_item * unit_tiles + slot;
        // This warp's pairs: its half of the item's (all of them, with one half).
        let skip = half * 8 * NT;
        let mine = Item { expert: item.expert, first: item.first + skip, len: item.len.saturating_sub(skip) };
        // A warp past the expert's last row tile, or without pairs, streams nothing but meets
        // the barriers.
        let live = row_tile < tiles && mine.len > 0;
        let tile = item.expert * tiles + row_tile;
        let mut acc = [[FragC::ZERO; NT]; 2];
        for start in (0..steps).step_by(window_steps) {
            let pieces = window_steps.min(steps - start) * STEP / 8;
            // The last window's (or unit's) readers are done with the slots.
            block::sync();
            copy_rows_async(staged, row_words, x_words, item.len, pieces, |p| (dispatch.pair_token.load(item.first + p) as usize * hidden + start * STEP) / 8);
            shared::wait_async_copies();
            block::sync();
            if !live {
                continue;
            }
            for chunk in (start..start + pieces * 8 / STEP).step_by(GATE_UP_UNROLL) {
                let mut a = [[[[0u32; 4]; 2]; 2]; GATE_UP_UNROLL];
                unroll!(u in [0 1 2 3] {
                    // SAFETY: `tile` is a row tile of the expert's (checked lengths), and `chunk
                    // + u < steps` (a window's steps are whole chunks: `hidden` is a multiple of
                    // `STEP · GATE_UP_UNROLL`); the weights are inputs.
                    a[u] = unsafe { [tile_words(w_gate, tile, steps, chunk + u), tile_words(w_up, tile, steps, chunk + u)] };
                });
                unroll!(u in [0 1 2 3] {
                    let [gate, up] = &mut acc;
                    for (n, (gate, up)) in gate.iter_mut().zip(up).enumerate() {
                        let p = 8 * n + lane / 4;
                        let b = if p < mine.len { staged.load16::<4>((skip + p) * row_words / 4 + (chunk + u - start) * STEP / 8 + lane % 4) } else { [0; 4] };
                        *gate = mma_step(a[u][0], b, *gate);
                        *up = mma_step(a[u][1], b, *up);
                    }
                });
            }
        }
        if live {
            op.write(&acc, mine, row_tile);
        }
    }
}

/// The down kernels' sizes from their arguments, `(tokens, hidden, ffn, experts)`:
/// `pair_gate` holds `tokens · k` values, `routing` `experts + tokens · k`, `h` `tokens · k`
/// rows of `ffn`, `out` `tokens` rows of `hidden`. Traps unless the FFN is whole K-steps,
/// `hidden` whole blocks of `rows` output rows and `w_down` the experts' `hidden × ffn`.
#[inline(always)]
fn down_sizes(h: &Out<bf16>, routing: &Out<u32>, pair_gate: &Out<f32>, w_down: &[bf16], out: &Out<bf16>, k: usize, rows: usize) -> (usize, usize, usize, usize) {
    let tokens = pair_gate.len() / k;
    let hidden = out.len() / tokens;
    let ffn = h.len() / (tokens * k);
    let experts = routing.len() - tokens * k;
    if !ffn.is_multiple_of(STEP) || !hidden.is_multiple_of(rows) || w_down.len() != experts * hidden * ffn {
        arch::trap();
    }
    (tokens, hidden, ffn, experts)
}

/// The down kernel, for groups of `8 · NT` pairs.
#[inline(always)]
fn down<const NT: usize>(h: &Out<bf16>, routing: &Out<u32>, pair_gate: &Out<f32>, w_down: &[bf16], out: &Out<bf16>, k: usize) {
    let (tokens, hidden, ffn, experts) = down_sizes(h, routing, pair_gate, w_down, out, k, ROWS);
    let group = 8 * NT;
    let mut smem = shared::dynamic();
    let dispatch = Dispatch::take(&mut smem, experts, tokens * k);
    // Each warp's per-token sums of the rows: `warp × ROWS × tokens`.
    let sums = smem.take::<f32>(WARPS * ROWS * tokens);
    let total = smem.take::<f32>(ROWS * tokens);
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    dispatch.receive(routing, pair_gate, group);

    let steps = ffn / STEP;
    // The cluster's warps split the flat list of (item, K-step) units into contiguous ranges
    // (`w` the warp's index in the cluster's), so that a warp streams each item's row tile in
    // K order and changes item at most a few times.
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    let (w, cluster_warps) = (rank * WARPS + warp, size * WARPS);
    let units = dispatch.items() * steps;
    let (lo, hi) = (w * units / cluster_warps, (w + 1) * units / cluster_warps);
    let unroll = DOWN_UNROLL / NT;
    let clusters = grid::dim().x as usize / size;
    for tile in (cluster::index_in_grid().x as usize..hidden / ROWS).step_by(clusters) {
        for i in (lane..ROWS * tokens).step_by(32) {
            sums.store(warp * ROWS * tokens + i, 0.0);
        }
        // A lane's cells of a token change with each item's pair columns.
        warp::sync();
        dispatch.for_each_run(lo..hi, steps, group, |item, run| {
            let end = run.end;
            let row_tile = item.expert * (hidden / ROWS) + tile;
            let mut acc = [FragC::ZERO; NT];
            for chunk in run.step_by(unroll) {
                let mut a = [[[0u32; 4]; 2]; DOWN_UNROLL];
                let mut b = [[[0u32; 4]; NT]; DOWN_UNROLL];
                unroll!(u in [0 1 2 3 4 5] {
                    let s = chunk + u;
                    if u < unroll && s < end {
                        // SAFETY: the row tile is the expert's (checked lengths) and `s <
                        // steps`; weights are inputs.
                        a[u] = unsafe { tile_words(w_down, row_tile, steps, s) };
                        for (n, b) in b[u].iter_mut().enumerate() {
                            let p = 8 * n + lane / 4;
                            if p < item.len {
                                *b = load_words_out(h, ((item.first + p) * ffn + s * STEP) / 8 + lane % 4);
                            }
                        }
                    }
                });
                unroll!(u in [0 1 2 3 4 5] {
                    if u < unroll && chunk + u < end {
                        for n in 0..NT {
                            acc[n] = mma_step(a[u], b[u][n], acc[n]);
                        }
                    }
                });
            }
            dispatch.add_run(&acc, item, sums.slice(warp * ROWS * tokens, ROWS * tokens));
        });
        block::sync();
        // The block's sum over its warps, then the cluster's over its blocks (rank order).
        for i in block::stride_loop(0..ROWS * tokens) {
            total.store(i, (0..WARPS).map(|w| sums.load(w * ROWS * tokens + i)).sum::<f32>());
        }
        if size > 1 {
            cluster::reduce(total, Sum);
        } else {
            block::sync();
        }
        for i in block::stride_loop(0..ROWS * tokens) {
            let (r, t) = (i / tokens, i % tokens);
            if i % size == rank {
                out.set(t * hidden + tile * ROWS + r, bf16::from_f32(total.load(i)));
            }
        }
        block::sync();
    }
}

/// K-steps of `h` a staged down block holds in shared memory at once (a multiple of the
/// unroll).
const DOWN_WINDOW_STEPS: usize = 24;

/// The down kernel on the staged schedule, for groups of `8 · NT` pairs: a cluster per 128
/// output rows (8 row tiles, one a warp), whose blocks split the flat list of (item, K-step)
/// units into contiguous ranges. A block walks its range a run (one item's steps) at a time,
/// copies the run's `h` of the item's pairs into shared memory [`DOWN_WINDOW_STEPS`] K-steps
/// at a time (`cp.async`), and each warp streams its 16 rows of the window against it, B read
/// at each `mma`: `h` crosses from L2 once per 128 output rows instead of once per 16, and
/// registers hold only the weights in flight. Each warp adds a run's rows times the gate
/// weights to its own rows' sums, and `cluster::reduce_scatter` adds the blocks' in rank
/// order into `y`.
#[inline(always)]
fn down_staged<const NT: usize>(h: &Out<bf16>, routing: &Out<u32>, pair_gate: &Out<f32>, w_down: &[bf16], out: &Out<bf16>, k: usize) {
    let (tokens, hidden, ffn, experts) = down_sizes(h, routing, pair_gate, w_down, out, k, ROWS * WARPS);
    let group = 8 * NT;
    let mut smem = shared::dynamic();
    let dispatch = Dispatch::take(&mut smem, experts, tokens * k);
    let row_words = padded_row_words(DOWN_WINDOW_STEPS * STEP);
    let staged = smem.take::<u32>(group * row_words);
    // Each warp's rows' per-token sums: output row `warp · 16 + r` of the cluster's 128 at
    // `(warp · 16 + r) · tokens`.
    let sums = smem.take::<f32>(WARPS * ROWS * tokens);
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    dispatch.receive(routing, pair_gate, group);
    // SAFETY: `h` is a whole kernel argument that no thread writes, and the kernel that wrote
    // it has finished (`receive` waited for it); the view lives as long as the kernel's reads.
    let h_words = unsafe { core::slice::from_raw_parts(h.as_mut_ptr().cast::<u32>(), h.len() / 2) };

    let steps = ffn / STEP;
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    let units = dispatch.items() * steps;
    let (lo, hi) = (rank * units / size, (rank + 1) * units / size);
    let clusters = grid::dim().x as usize / size;
    let mine = sums.slice(warp * ROWS * tokens, ROWS * tokens);
    for rows in (cluster::index_in_grid().x as usize..hidden / (ROWS * WARPS)).step_by(clusters) {
        let row_tile = rows * WARPS + warp;
        for i in (lane..ROWS * tokens).step_by(32) {
            mine.store(i, 0.0);
        }
        warp::sync();
        dispatch.for_each_run(lo..hi, steps, group, |item, run| {
            let end = run.end;
            let tile = item.expert * (hidden / ROWS) + row_tile;
            let mut acc = [FragC::ZERO; NT];
            for start in run.step_by(DOWN_WINDOW_STEPS) {
                let window = DOWN_WINDOW_STEPS.min(end - start);
                let pieces = window * STEP / 8;
                // The last window's readers are done with the slots.
                block::sync();
                copy_rows_async(staged, row_words, h_words, item.len, pieces, |p| ((item.first + p) * ffn + start * STEP) / 8);
                shared::wait_async_copies();
                block::sync();
                for chunk in (start..start + window).step_by(DOWN_UNROLL) {
                    let mut a = [[[0u32; 4]; 2]; DOWN_UNROLL];
                    unroll!(u in [0 1 2 3 4 5] {
                        if chunk + u < start + window {
                            // SAFETY: the row tile is the expert's (checked lengths) and
                            // `chunk + u < steps`; weights are inputs.
                            a[u] = unsafe { tile_words(w_down, tile, steps, chunk + u) };
                        }
                    });
                    unroll!(u in [0 1 2 3 4 5] {
                        if chunk + u < start + window {
                            for (n, acc) in acc.iter_mut().enumerate() {
                                let p = 8 * n + lane / 4;
                                let b = if p < item.len { staged.load16::<4>(p * row_words / 4 + (chunk + u - start) * STEP / 8 + lane % 4) } else { [0; 4] };
                                *acc = mma_step(a[u], b, *acc);
                            }
                        }
                    });
                }
            }
            dispatch.add_run(&acc, item, mine);
        });
        // The blocks' sums of the 128 rows, added in rank order, each block writing its share
        // (between two cluster barriers: the warps' sums are complete before any is read).
        cluster::reduce_scatter(sums, Sum, |i, v| out.set(i % tokens * hidden + rows * WARPS * ROWS + i / tokens, bf16::from_f32(v)));
    }
}

macro_rules! moe_kernels {
    (gate_up: [$($gate_up:ident, $g_nt:literal, $g_pairs:literal;)*] staged: [$($staged:ident, $s_nt:literal, $s_pairs:literal;)*] down: [$($down:ident, $d_nt:literal, $d_pairs:literal;)*] staged_down: [$($staged_down:ident, $sd_nt:literal, $sd_pairs:literal;)*]) => {
        $(
            /// MoE launch 1/2 (routing, gate and up projections) for experts serving up to
            #[doc = concat!($g_pairs, " pairs per pass over their weights (more take another pass).")]
            /// `top_ids`/`top_gates` (`tokens × top_k`) receive the routing; `h` (`tokens · top_k ×
            /// ffn`) the pairs' activations, `routing` (`experts + tokens · top_k`: each
            /// expert's pair count, then the pairs' tokens) and `pair_gate` what the down kernel needs;
            /// `split` warps share a unit ([`host::Schedule::Warps`]).
            #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
            #[allow(clippy::too_many_arguments)]
            pub fn $gate_up(x: &[bf16], router: &[bf16], w_gate: &[bf16], w_up: &[bf16], h: Out<bf16>, routing: Out<u32>, pair_gate: Out<f32>, top_ids: Out<u32>, top_gates: Out<f32>, top_k: u32, renormalize: u32, split: u32) {
                gate_up::<$g_nt, false>(x, router, w_gate, w_up, &h, &routing, &pair_gate, &top_ids, &top_gates, top_k as usize, renormalize != 0, split as usize)
            }
        )*
        $(
            /// MoE launch 1/2 on the staged schedule ([`host::Schedule::Staged`]), for experts serving up to
            #[doc = concat!($s_pairs, " pairs per pass; arguments as the warp schedule's, less `split`.")]
            #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
            #[allow(clippy::too_many_arguments)]
            pub fn $staged(x: &[bf16], router: &[bf16], w_gate: &[bf16], w_up: &[bf16], h: Out<bf16>, routing: Out<u32>, pair_gate: Out<f32>, top_ids: Out<u32>, top_gates: Out<f32>, top_k: u32, renormalize: u32) {
                gate_up::<$s_nt, true>(x, router, w_gate, w_up, &h, &routing, &pair_gate, &top_ids, &top_gates, top_k as usize, renormalize != 0, 1)
            }
        )*
        $(
            /// MoE launch 2/2 (down projection and combine) for experts serving up to
            #[doc = concat!($d_pairs, " pairs per pass; `out` is `tokens × hidden`.")]
            #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
            pub fn $down(h: Out<bf16>, routing: Out<u32>, pair_gate: Out<f32>, w_down: &[bf16], out: Out<bf16>, top_k: u32) {
                down::<$d_nt>(&h, &routing, &pair_gate, w_down, &out, top_k as usize)
            }
        )*
        $(
            /// MoE launch 2/2 on the staged schedule ([`host::Schedule::Staged`]: a cluster per 128
            #[doc = concat!("output rows), for up to ", $sd_pairs, " pairs per pass; arguments as the other down kernels'.")]
            #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
            pub fn $staged_down(h: Out<bf16>, routing: Out<u32>, pair_gate: Out<f32>, w_down: &[bf16], out: Out<bf16>, top_k: u32) {
                down_staged::<$sd_nt>(&h, &routing, &pair_gate, w_down, &out, top_k as usize)
            }
        )*
    };
}

// The down kernel has no 32-pair form: with 4 n-tiles too few of its steps' loads fit in
// flight (Mixtral's at 64 tokens took 809 µs against 414 with groups of 16).
moe_kernels! {
    gate_up: [moe_gate_up_g8, 1, 8; moe_gate_up_g16, 2, 16; moe_gate_up_g32, 4, 32;]
    staged: [moe_gate_up_staged_g8, 1, 8; moe_gate_up_staged_g16, 2, 16; moe_gate_up_staged_g32, 4, 32;]
    down: [moe_down_g8, 1, 8; moe_down_g16, 2, 16;]
    staged_down: [moe_down_staged_g8, 1, 8; moe_down_staged_g16, 2, 16;]
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host {
    //! A layer on the host: shapes, random weights, the f64 reference, device buffers and the
    //! two launches.

    use super::*;
    use crate::uniform;
    use clusterfuse::host::{Buffer, Error, Gpu, Result, Stream};
    use rayon::prelude::*;

    /// Relative error allowed against the f64 reference: `h` and `y` are rounded to bf16
    /// (2⁻⁹ each), with room for f32 accumulation.
    pub const TOLERANCE: f64 = 1e-2;

    /// A layer's shape.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Layer {
        pub hidden: usize,
        pub experts: usize,
        pub top_k: usize,
        /// Each expert's FFN width.
        pub ffn: usize,
        /// Gate weights: softmax over the top k (`true`: Mixtral), or the full softmax's top k
        /// (`false`: DeepSeek-V2, Qwen-MoE).
        pub renormalize: bool,
    }

    impl Layer {
        /// Mixtral-8x7B: hidden 4096, 8 experts, top 2, FFN 14336.
        pub const MIXTRAL_8X7B: Layer = Layer { hidden: 4096, experts: 8, top_k: 2, ffn: 14336, renormalize: true };
        /// DeepSeek-V2-Lite / Qwen-MoE-shaped: hidden 2048, 64 experts, top 8, FFN 1408.
        pub const DEEPSEEK_V2_LITE: Layer = Layer { hidden: 2048, experts: 64, top_k: 8, ffn: 1408, renormalize: false };

        /// Whether the kernels run this layer at `tokens` tokens with clusters of `cluster`
        /// (shared memory aside: [`plan`] checks it against the device's limit).
        pub fn check(&self, tokens: usize, cluster: u32) -> Result<()> {
            let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel: "the MoE layer", reason });
            let c = cluster as usize;
            if !(1..=MAX_TOKENS).contains(&tokens) {
                return unsupported(format!("{tokens} tokens: the kernels route 1 to {MAX_TOKENS}"));
            }
            if !(1..=MAX_TOP_K).contains(&self.top_k) || self.top_k > self.experts {
                return unsupported(format!("top {} of {} experts: k is 1 to {MAX_TOP_K}, at most the experts", self.top_k, self.experts));
            }
            if !(1..=16).contains(&c) || !self.experts.is_multiple_of(c) || self.experts >= 1 << 16 {
                return unsupported(format!("{} experts over clusters of {cluster}: the cluster (1-16 blocks) must divide the experts, fewer than 65536", self.experts));
            }
            if self.hidden == 0 || self.ffn == 0 || !self.hidden.is_multiple_of(STEP * GATE_UP_UNROLL) || !self.ffn.is_multiple_of(STEP) {
                return unsupported(format!("hidden {} and FFN {}: the hidden size must be a positive multiple of {}, the FFN of {STEP}", self.hidden, self.ffn, STEP * GATE_UP_UNROLL));
            }
            Ok(())
        }

        /// Bytes of one expert's weights (gate, up, down).
        pub fn expert_bytes(&self) -> usize {
            3 * self.hidden * self.ffn * 2
        }

        /// Bytes a step must move when `selected` experts serve `tokens` tokens: the router,
        /// those experts' weights, `x` and `y`.
        pub fn step_bytes(&self, tokens: usize, selected: usize) -> usize {
            (self.experts * self.hidden + 2 * tokens * self.hidden) * 2 + selected * self.expert_bytes()
        }
    }

    /// One step's inputs: `tokens` rows of `x` and the layer's weights, row-major: `router`
    /// is `experts × hidden`, `w_gate` and `w_up` `experts × ffn × hidden`, `w_down` `experts ×
    /// hidden × ffn`.
    pub struct Moe {
        pub layer: Layer,
        pub tokens: usize,
        pub x: Vec<bf16>,
        pub router: Vec<bf16>,
        pub w_gate: Vec<bf16>,
        pub w_up: Vec<bf16>,
        pub w_down: Vec<bf16>,
    }

    impl Moe {
        /// Random inputs from `seed`, scaled so that every activation is of order 1.
        pub fn random(layer: Layer, tokens: usize, seed: u64) -> Result<Self> {
            layer.check(tokens, 1)?;
            let (h, f, e) = (layer.hidden, layer.ffn, layer.experts);
            let (sh, sf) = ((3.0 / h as f32).sqrt(), (3.0 / f as f32).sqrt());
            Ok(Moe {
                layer,
                tokens,
                x: uniform(seed, tokens * h, -1.0, 1.0),
                router: uniform(seed + 1, e * h, -2.0 * sh, 2.0 * sh),
                w_gate: uniform(seed + 2, e * f * h, -sh, sh),
                w_up: uniform(seed + 3, e * f * h, -sh, sh),
                w_down: uniform(seed + 4, e * h * f, -sf, sf),
            })
        }
    }

    /// The f64 reference of one step.
    pub struct Reference {
        /// `tokens × experts`.
        pub logits: Vec<f64>,
        /// `tokens × top_k`: each token's experts, largest logit first (ties: lower index).
        pub ids: Vec<u32>,
        /// `tokens × top_k`: their gate weights.
        pub gates: Vec<f64>,
        /// `tokens × hidden`.
        pub out: Vec<f64>,
    }

    fn dot(w: &[bf16], x: &[f64]) -> f64 {
        w.iter().zip(x).map(|(w, x)| w.to_f32() as f64 * x).sum()
    }

    impl Reference {
        /// Computes it (the pairs' expert FFNs in parallel).
        pub fn new(moe: &Moe) -> Self {
            let Layer { hidden, experts, top_k: k, ffn, renormalize } = moe.layer;
            let xs: Vec<Vec<f64>> = moe.x.chunks(hidden).map(|x| x.iter().map(|v| v.to_f32() as f64).collect()).collect();
            let logits: Vec<f64> = xs.iter().flat_map(|x| moe.router.chunks(hidden).map(|w| dot(w, x))).collect();
            let (mut ids, mut gates) = (Vec::new(), Vec::new());
            for row in logits.chunks(experts) {
                let mut order: Vec<usize> = (0..experts).collect();
                order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
                let max = row[order[0]];
                let total: f64 = if renormalize { order[..k].iter().map(|&e| (row[e] - max).exp()).sum() } else { row.iter().map(|l| (l - max).exp()).sum() };
                ids.extend(order[..k].iter().map(|&e| e as u32));
                gates.extend(order[..k].iter().map(|&e| (row[e] - max).exp() / total));
            }
            let expert_out = |t: usize, e: usize| -> Vec<f64> {
                let (gate, up) = (&moe.w_gate[e * ffn * hidden..][..ffn * hidden], &moe.w_up[e * ffn * hidden..][..ffn * hidden]);
                let act: Vec<f64> = gate.chunks(hidden).zip(up.chunks(hidden)).map(|(g, u)| {
                    let (g, u) = (dot(g, &xs[t]), dot(u, &xs[t]));
                    g / (1.0 + (-g).exp()) * u
                }).collect();
                moe.w_down[e * hidden * ffn..][..hidden * ffn].chunks(ffn).map(|w| dot(w, &act)).collect()
            };
            let pairs: Vec<Vec<f64>> = ids.par_iter().enumerate().map(|(p, &e)| expert_out(p / k, e as usize)).collect();
            let mut out = vec![0.0; moe.tokens * hidden];
            for (p, y) in pairs.iter().enumerate() {
                for (o, v) in out[p / k * hidden..][..hidden].iter_mut().zip(y) {
                    *o += gates[p] * v;
                }
            }
            Reference { logits, ids, gates, out }
        }

        /// The experts at least one token chose.
        pub fn selected(&self, experts: usize) -> usize {
            let mut chosen = vec![false; experts];
            self.ids.iter().for_each(|&e| chosen[e as usize] = true);
            chosen.iter().filter(|&&c| c).count()
        }

        /// Where `ids` (a launch's `top_ids`) differs from the reference's choice other than
        /// between logits equal to 1e-6 of the largest: `(token, slot, ours, reference)`.
        pub fn routing_mismatches(&self, ids: &[u32], experts: usize) -> Vec<(usize, usize, u32, u32)> {
            let k = self.ids.len() / (self.logits.len() / experts);
            let scale = self.logits.iter().fold(0.0f64, |m, l| m.max(l.abs()));
            ids.iter().zip(&self.ids).enumerate().filter_map(|(p, (&ours, &theirs))| {
                let row = &self.logits[p / k * experts..][..experts];
                let tie = (row[ours as usize % experts] - row[theirs as usize]).abs() <= 1e-6 * scale;
                (ours != theirs && !(tie && (ours as usize) < experts)).then_some((p / k, p % k, ours, theirs))
            }).collect()
        }
    }

    /// Row-major `rows × cols` matrices, stacked (`rows` a multiple of 16, `cols` of 32), in
    /// the kernels' tiled layout: each 16-row tile of a matrix stays in place as a block, its
    /// 16 × 32 tiles one after another along K, row-major inside (element `(r, c)` of tile `s`
    /// at `512 s + 32 r + c`), so that a warp streams its rows as one contiguous run
    /// (`tile_words`). [`Buffers::upload`] uploads the experts' weights so.
    pub fn tile(w: &[bf16], cols: usize) -> Vec<bf16> {
        assert!(cols.is_multiple_of(STEP) && w.len().is_multiple_of(ROWS * cols), "{} values are not whole tiles of 16 rows × {cols} columns", w.len());
        let mut tiled = vec![bf16::from_f32(0.0); w.len()];
        tiled.par_chunks_mut(ROWS * cols).zip(w.par_chunks(ROWS * cols)).for_each(|(dst, src)| {
            for (s, tile) in dst.chunks_mut(ROWS * STEP).enumerate() {
                for (r, row) in tile.chunks_mut(STEP).enumerate() {
                    row.copy_from_slice(&src[r * cols + s * STEP..][..STEP]);
                }
            }
        });
        tiled
    }

    /// The MoE kernels, loaded on one device.
    pub struct Kernels {
        gate_up_g8: moe_gate_up_g8::Kernel,
        gate_up_g16: moe_gate_up_g16::Kernel,
        gate_up_g32: moe_gate_up_g32::Kernel,
        staged_g8: moe_gate_up_staged_g8::Kernel,
        staged_g16: moe_gate_up_staged_g16::Kernel,
        staged_g32: moe_gate_up_staged_g32::Kernel,
        down_g8: moe_down_g8::Kernel,
        down_g16: moe_down_g16::Kernel,
        staged_down_g8: moe_down_staged_g8::Kernel,
        staged_down_g16: moe_down_staged_g16::Kernel,
    }

    impl Kernels {
        /// Loads them.
        pub fn load(gpu: &Gpu) -> Result<Self> {
            Ok(Kernels {
                gate_up_g8: moe_gate_up_g8::load(gpu)?,
                gate_up_g16: moe_gate_up_g16::load(gpu)?,
                gate_up_g32: moe_gate_up_g32::load(gpu)?,
                staged_g8: moe_gate_up_staged_g8::load(gpu)?,
                staged_g16: moe_gate_up_staged_g16::load(gpu)?,
                staged_g32: moe_gate_up_staged_g32::load(gpu)?,
                down_g8: moe_down_g8::load(gpu)?,
                down_g16: moe_down_g16::load(gpu)?,
                staged_down_g8: moe_down_staged_g8::load(gpu)?,
                staged_down_g16: moe_down_staged_g16::load(gpu)?,
            })
        }
    }

    /// A step's buffers on a device: the inputs (expert weights [`tile`]d), the two kernels'
    /// hand-over, and poisoned outputs.
    pub struct Buffers {
        pub layer: Layer,
        pub tokens: usize,
        pub x: Buffer<bf16>,
        pub router: Buffer<bf16>,
        pub w_gate: Buffer<bf16>,
        pub w_up: Buffer<bf16>,
        pub w_down: Buffer<bf16>,
        /// `tokens · top_k × ffn`: the pairs' activations.
        pub h: Buffer<bf16>,
        /// Each expert's pair count, then the pairs' tokens.
        pub routing: Buffer<u32>,
        pub pair_gate: Buffer<f32>,
        /// `tokens × top_k`.
        pub top_ids: Buffer<u32>,
        pub top_gates: Buffer<f32>,
        /// `tokens × hidden`.
        pub out: Buffer<bf16>,
    }

    /// A step's hand-over (`h`, `routing`, `pair_gate`) and output (`top_ids`, `top_gates`,
    /// `out`) buffers, in [`Buffers`]' order.
    type Poisoned = (Buffer<bf16>, Buffer<u32>, Buffer<f32>, Buffer<u32>, Buffer<f32>, Buffer<bf16>);

    /// Those buffers for `tokens` tokens of `layer`, poisoned: NaN, or `u32::MAX`.
    fn poisoned(gpu: &Gpu, layer: Layer, tokens: usize) -> Result<Poisoned> {
        let pairs = tokens * layer.top_k;
        let nan = bf16::from_f32(f32::NAN);
        Ok((
            gpu.upload(&vec![nan; pairs * layer.ffn])?,
            gpu.upload(&vec![u32::MAX; layer.experts + pairs])?,
            gpu.upload(&vec![f32::NAN; pairs])?,
            gpu.upload(&vec![u32::MAX; pairs])?,
            gpu.upload(&vec![f32::NAN; pairs])?,
            gpu.upload(&vec![nan; tokens * layer.hidden])?,
        ))
    }

    impl Buffers {
        /// Uploads `moe`, with every output and hand-over buffer poisoned.
        pub fn upload(gpu: &Gpu, moe: &Moe) -> Result<Self> {
            let Layer { hidden, ffn, .. } = moe.layer;
            let (h, routing, pair_gate, top_ids, top_gates, out) = poisoned(gpu, moe.layer, moe.tokens)?;
            Ok(Buffers {
                layer: moe.layer,
                tokens: moe.tokens,
                x: gpu.upload(&moe.x)?,
                router: gpu.upload(&moe.router)?,
                w_gate: gpu.upload(&tile(&moe.w_gate, hidden))?,
                w_up: gpu.upload(&tile(&moe.w_up, hidden))?,
                w_down: gpu.upload(&tile(&moe.w_down, ffn))?,
                h,
                routing,
                pair_gate,
                top_ids,
                top_gates,
                out,
            })
        }

        /// Poisons the outputs and the hand-over again.
        pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
            (self.h, self.routing, self.pair_gate, self.top_ids, self.top_gates, self.out) = poisoned(gpu, self.layer, self.tokens)?;
            Ok(())
        }

        /// `y` (as f32), the chosen experts and their gate weights.
        pub fn results(&self, gpu: &Gpu) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
            let out = gpu.download(&self.out)?.iter().map(|v| v.to_f32()).collect();
            Ok((out, gpu.download(&self.top_ids)?, gpu.download(&self.top_gates)?))
        }
    }

    /// How the gate/up kernel spreads its units (16 rows of an item) over warps.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Schedule {
        /// A unit per group of `split` warps of a block, which split its K-steps (1, 2 or 4;
        /// 2 and 4 with groups of 8 pairs only); each warp reads its pairs' `x` from L2.
        Warps { split: usize },
        /// A block's 8 warps on 8 row tiles of one item, its pairs' `x` staged in shared
        /// memory once per block (the same sums, bit for bit).
        Staged,
    }

    /// How a step launches: each kernel's pair group, the gate/up schedule, and both launch
    /// configurations.
    #[derive(Clone, Copy, Debug)]
    pub struct Plan {
        /// Pairs an expert's pass over its weights serves in the gate/up kernel: 8, 16 or 32.
        pub gate_up_group: usize,
        /// How the gate/up kernel spreads its units.
        pub gate_up_schedule: Schedule,
        /// The same in the down kernel: 8 or 16.
        pub down_group: usize,
        /// Whether the down kernel is on the staged schedule (a cluster per 128 output rows,
        /// `h` in shared memory) rather than a cluster per 16 rows reading `h` from L2.
        pub down_staged: bool,
        pub gate_up: LaunchConfig,
        pub down: LaunchConfig,
    }

    /// Shared memory of the gate/up kernel: the routing's arrays, 16-byte aligned each, then
    /// the schedule's: all of `x` when it fits and the K-split parts' accumulators (`group`
    /// pairs, `split` warps a unit), or the staged window of `group` pairs' `x`.
    fn gate_up_smem(layer: &Layer, tokens: usize, cluster: usize, group: usize, schedule: Schedule) -> usize {
        let (pairs, e) = (tokens * layer.top_k, layer.experts);
        let partials = WARPS * ROWS * tokens.next_multiple_of(8) * 4;
        let parts = match schedule {
            Schedule::Warps { split } => {
                let xs = if group == 8 { x_smem_bytes(tokens, layer.hidden) } else { 0 };
                xs.next_multiple_of(16) + WARPS / split * (split - 1) * 2 * (group / 8) * 4 * 32 * 4
            }
            Schedule::Staged => group * padded_row_words(window_columns(layer.hidden)) * 4,
        };
        let sizes = [tokens * e / cluster * 4, partials, tokens * 4, pairs * cluster * 8, pairs * 8, pairs * 4, pairs * 4, 2 * e * 4, parts];
        sizes.iter().map(|b| b.next_multiple_of(16)).sum::<usize>() + dispatch_smem(layer, tokens)
    }

    fn dispatch_smem(layer: &Layer, tokens: usize) -> usize {
        let pairs = tokens * layer.top_k;
        [layer.experts * 4, layer.experts * 4, pairs * 4, pairs * 4, (pairs + 1) * 4].iter().map(|b| b.next_multiple_of(16)).sum()
    }

    /// The launches of `layer` at `tokens` tokens: gate/up in clusters of `cluster`, as many
    /// blocks as the GPU holds at once (at most one per 2 units of the largest routing),
    /// pairs in groups of 8, 16 or 32, whichever first holds twice an expert's average share,
    /// on the warp schedule, each unit's K split (groups of 8) over the most warps (4, 2 or 1)
    /// that keep all units in one round — or on the staged one where groups of 8 leave `x`
    /// too large for shared memory (more than 8 tokens of hidden 4096); the down kernel a
    /// cluster per 16 output rows, of as many blocks (1, 2 or 4, splitting K) as keep the
    /// grid within two blocks per SM, launched programmatically with `programmatic`.
    pub fn plan(kernels: &Kernels, gpu: &Gpu, layer: Layer, tokens: usize, cluster: u32, programmatic: bool) -> Result<Plan> {
        plan_for(kernels, gpu, layer, tokens, cluster, programmatic, false)
    }

    /// [`plan`] with both kernels on their staged schedules: the gate/up units on
    /// [`Schedule::Staged`], as many blocks as the GPU holds at once (at most one per 8
    /// units), and the down kernel a cluster per 128 output rows of as many blocks (1-16,
    /// splitting K) as keep the grid within two blocks per SM and each block about two
    /// windows of K-steps.
    pub fn staged_plan(kernels: &Kernels, gpu: &Gpu, layer: Layer, tokens: usize, cluster: u32, programmatic: bool) -> Result<Plan> {
        plan_for(kernels, gpu, layer, tokens, cluster, programmatic, true)
    }

    fn plan_for(kernels: &Kernels, gpu: &Gpu, layer: Layer, tokens: usize, cluster: u32, programmatic: bool, staged: bool) -> Result<Plan> {
        layer.check(tokens, cluster)?;
        // Groups hold about twice an expert's average share of the pairs (all tokens, at most).
        let share = tokens.min(2 * tokens * layer.top_k / layer.experts);
        let group = [8, 16, 32].into_iter().find(|&g| g >= share).unwrap_or(32);
        // The warp schedule with groups of 8 holds all of `x` in shared memory.
        let staged_gate_up = staged || (group == 8 && !x_fits(tokens, layer.hidden));
        let c = cluster as usize;
        let first = if staged_gate_up { Schedule::Staged } else { Schedule::Warps { split: 1 } };
        let mut gate_up = LaunchConfig { grid: cluster.into(), block: BLOCK.into(), cluster: Some(cluster.into()), dynamic_smem_bytes: gate_up_smem(&layer, tokens, c, group, first) as u32, ..LaunchConfig::default() };
        let raw = match (group, staged_gate_up) {
            (8, false) => kernels.gate_up_g8.raw(),
            (16, false) => kernels.gate_up_g16.raw(),
            (_, false) => kernels.gate_up_g32.raw(),
            (8, true) => kernels.staged_g8.raw(),
            (16, true) => kernels.staged_g16.raw(),
            (_, true) => kernels.staged_g32.raw(),
        };
        let resident = raw.max_resident_blocks(gpu.stream(), &raw.plan(&gate_up)?)?;
        // The most experts a routing can select.
        let selected = layer.experts.min(tokens * layer.top_k);
        let units = selected * layer.ffn / ROWS + tokens * layer.top_k / group * layer.ffn / ROWS;
        let wanted = (units.div_ceil(if staged_gate_up { WARPS } else { 2 }) as u64).min(resident).max(1);
        gate_up.grid = (wanted.div_ceil(c as u64) as u32 * cluster).into();
        // Few units (DeepSeek's experts at a token or two) leave most warps idle: split each
        // unit's K over 2 or 4 warps while every unit still has its group in the first round.
        let warps = gate_up.grid.x as usize * WARPS;
        let steps = layer.hidden / STEP;
        let split = [4, 2, 1].into_iter().find(|&s| s == 1 || (group == 8 && units * s <= warps && steps.is_multiple_of(s * GATE_UP_UNROLL))).unwrap_or(1);
        let schedule = if staged_gate_up { Schedule::Staged } else { Schedule::Warps { split } };
        gate_up.dynamic_smem_bytes = gate_up_smem(&layer, tokens, c, group, schedule) as u32;
        // The down kernel's clusters (of 16, 32 ... output rows: a row tile, or a staged
        // block's 8) split K, so that its blocks fill two per SM.
        let down_group = group.min(16);
        let row_groups = layer.hidden / if staged { ROWS * WARPS } else { ROWS };
        let sms = gpu.multiprocessors()?.unwrap_or(132);
        // Staged: no more blocks than leave each about two windows of the selected experts'
        // K-steps.
        let (sizes, most): (&[usize], usize) = if staged { (&[16, 8, 4, 2, 1], (selected * layer.ffn / STEP / (2 * DOWN_WINDOW_STEPS)).max(1)) } else { (&[4, 2, 1], 4) };
        let down_smem = if staged {
            (down_group * padded_row_words(DOWN_WINDOW_STEPS * STEP) * 4).next_multiple_of(16) + WARPS * ROWS * tokens * 4
        } else {
            (WARPS * ROWS * tokens * 4).next_multiple_of(16) + ROWS * tokens * 4
        };
        let config = |split: usize| LaunchConfig {
            grid: ((row_groups * split) as u32).into(),
            block: BLOCK.into(),
            cluster: Some((split as u32).into()),
            dynamic_smem_bytes: (dispatch_smem(&layer, tokens) + down_smem) as u32,
            programmatic,
            ..LaunchConfig::default()
        };
        let raw = match (down_group, staged) {
            (8, false) => kernels.down_g8.raw(),
            (_, false) => kernels.down_g16.raw(),
            (8, true) => kernels.staged_down_g8.raw(),
            (_, true) => kernels.staged_down_g16.raw(),
        };
        // The largest such cluster the GPU can hold (16 blocks, non-portable, may not be: a
        // residency query that fails counts as no).
        let mut down = config(1);
        for split in sizes.iter().copied().filter(|&p| p > 1 && row_groups * p <= 2 * sms && p <= most) {
            if raw.max_resident_blocks(gpu.stream(), &raw.plan(&config(split))?).is_ok_and(|blocks| blocks >= split as u64) {
                down = config(split);
                break;
            }
        }
        Ok(Plan { gate_up_group: group, gate_up_schedule: schedule, down_group, down_staged: staged, gate_up, down })
    }

    /// One step on `stream`: the two launches of `plan`.
    pub fn step(kernels: &Kernels, stream: &Stream, b: &mut Buffers, plan: &Plan) -> Result<()> {
        gate_up(kernels, stream, b, plan)?;
        down(kernels, stream, b, plan)
    }

    /// The first launch alone: routing, gate and up projections.
    pub fn gate_up(kernels: &Kernels, stream: &Stream, b: &mut Buffers, plan: &Plan) -> Result<()> {
        let (k, renormalize) = (b.layer.top_k as u32, u32::from(b.layer.renormalize));
        macro_rules! launch {
            ($kernel:expr $(, $split:expr)?) => {
                $kernel.launch(stream, &plan.gate_up, &b.x, &b.router, &b.w_gate, &b.w_up, &mut b.h, &mut b.routing, &mut b.pair_gate, &mut b.top_ids, &mut b.top_gates, k, renormalize $(, $split)?)
            };
        }
        match (plan.gate_up_group, plan.gate_up_schedule) {
            (8, Schedule::Warps { split }) => launch!(kernels.gate_up_g8, split as u32),
            (16, Schedule::Warps { split }) => launch!(kernels.gate_up_g16, split as u32),
            (_, Schedule::Warps { split }) => launch!(kernels.gate_up_g32, split as u32),
            (8, Schedule::Staged) => launch!(kernels.staged_g8),
            (16, Schedule::Staged) => launch!(kernels.staged_g16),
            (_, Schedule::Staged) => launch!(kernels.staged_g32),
        }
    }

    /// The second launch alone: the down projection and the combine, reading what the last
    /// [`gate_up`] on `b` wrote.
    pub fn down(kernels: &Kernels, stream: &Stream, b: &mut Buffers, plan: &Plan) -> Result<()> {
        let k = b.layer.top_k as u32;
        macro_rules! launch {
            ($kernel:expr) => {
                $kernel.launch(stream, &plan.down, &mut b.h, &mut b.routing, &mut b.pair_gate, &b.w_down, &mut b.out, k)
            };
        }
        match (plan.down_group, plan.down_staged) {
            (8, false) => launch!(kernels.down_g8),
            (_, false) => launch!(kernels.down_g16),
            (8, true) => launch!(kernels.staged_down_g8),
            (_, true) => launch!(kernels.staged_down_g16),
        }
    }
}
