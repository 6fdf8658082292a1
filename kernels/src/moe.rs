//! A mixture-of-experts layer at decode: router, top-k routing, and SiLU-gated expert FFNs
//! over only the experts the batch selects, bf16 weights and activations, f32 arithmetic on
//! tensor cores, 1-64 tokens, in two launches (one on the fused schedule):
//!
//! `y[t] = Σ_{e ∈ topk(t)} g[t, e] · W_down[e] · (silu(W_gate[e] · x[t]) ⊙ W_up[e] · x[t])`
//!
//! with `g` the softmax of the router logits `W_router · x[t]` (over all experts, or over the
//! top k alone with `renormalize`: Mixtral's gating, where the two are the same numbers).
//!
//! Four schedules share the routing ([`host::Schedule`]; [`host::plan`] picks one). The
//! *pairs* schedule, for few tokens, streams the weights through registers on `mma.sync`
//! warps, one pass over an expert's rows per group of the (token, expert) pairs it serves:
//!
//! [`fn@moe_gate_up_g8`] (and `_g16`, `_g32`; clusters of `C` blocks, as many as fit on the
//! GPU at once):
//! 1. **Routing, in every cluster.** Block `r` of a cluster computes the logits of experts
//!    `r·E/C ..` for every token on tensor cores (its router rows against the tokens, the
//!    warps splitting K, each chunk issuing the loads of 2-4 K-steps for up to 4 n-tiles of
//!    tokens at once, summed in warp order), and [`fn@top_k`] — a `#[cluster_primitive]` —
//!    finds each token's `k` largest over the whole cluster through DSMEM: each block's warps
//!    rank its local logits (each lane counts the larger ones) and post the top `k`, with
//!    the softmax's partial sums, into every peer's mailbox (`st.async`, counted by an
//!    mbarrier: one cluster barrier, relaxed), then every block ranks the `C·k` candidates
//!    the same way. Ties go to the lower expert index (the order is total: a logit and its
//!    index form one key), so every cluster derives the same routing with no grid-wide
//!    step: the gate weights, the tokens each expert serves (a 64-bit mask of tokens, by
//!    shared atomics), and the *pairs* — the `T·k` (token, expert) choices sorted by expert,
//!    then token — from a warp's prefix sums.
//! 2. **Gate and up projections** of 16 rows of one selected expert's `W_gate` and `W_up`
//!    for a group of that expert's pairs (an *item*) at a time, through `mma.m16n8k16`: the
//!    weights are the A operand, loaded in 16-byte vectors straight into fragment registers,
//!    the pairs' token vectors the B operand (8 pairs per n-tile). The experts' weights are
//!    stored in 16 × 32 tiles ([`host::tile`]), so that a warp reads 1 KB contiguous per
//!    K-step and its rows as one stream (row-major rows, 64 bytes per row and step, ran at
//!    72% of this speed). A 16-byte load holds 8 consecutive k of one row, not the
//!    fragment's k order; the dot product does not care, so B is loaded with the same
//!    permutation (lane `l` reads 8 consecutive k of token `l / 4`) and one pair of loads
//!    feeds two `mma`s. With groups of 8 pairs a block's 8 warps take 8 row tiles of one
//!    item, and the block copies the item's pairs' `x` into shared memory a window of 1024
//!    columns at a time (`cp.async`), so that a pair's vector crosses from L2 once a block
//!    and registers hold only the weights in flight (4 K-steps' loads at once). With 16 or
//!    32 pairs a warp takes an item's 16 rows alone (items round robin over the grid's warps,
//!    warp `w` of every block before warp `w + 1` of any) and loads its pairs' `x` from L2
//!    with the weights, 3 or 2 K-steps at once. The epilogue writes `h = silu(gate) ⊙ up`
//!    (bf16) per pair, in pair order.
//!
//! [`fn@moe_down_g8`] (and `_g16`; launched programmatically after it; a cluster per 16 rows of
//! the output, whose 1-4 blocks split K): the cluster's warps split the flat list of
//! (item, 32-wide K-step) units of the selected experts' `W_down` rows into contiguous
//! ranges; each warp streams its range (6 or 3 steps' loads in flight with groups of 8 or 16
//! pairs), multiplies it with the pairs' `h`, and adds each run inside one item times its
//! pairs' gate weights into its own per-token accumulators in shared memory; the
//! block sums its warps' accumulators in warp order, `cluster::reduce` the blocks' in rank
//! order, and the blocks write `y`. The combine is fused into the last projection, and
//! nothing is atomic: the output is bitwise deterministic.
//!
//! Every weight byte of a selected expert is read from memory once per step (a warp's rows
//! are read again only when an expert serves more pairs than its group holds: 8, 16 or 32
//! pairs per group for the `_g8`, `_g16`, `_g32` kernels — the down kernel's at most 16 —
//! chosen by [`host::plan`] at about twice the pairs an expert serves on average), and
//! unselected experts are never touched. Every weight load is evict-first in L2
//! ([`clusterfuse::global::L2Policy`]): a step's weights are read once and outsize the L2, and
//! under the default policy they evicted what the next step reads again — the router, `x`,
//! `h`, the kernels' code (1-7% of a step, results/moe-h200.md, session 36).
//!
//! The *tokens* schedule, for many tokens ([`fn@moe_gate_up_tokens`], [`fn@moe_down_tokens`]),
//! multiplies every token with each selected expert's rows on `wgmma` (64 tokens, zeros past
//! the last, as the B operand), so that an expert's rows are read once whatever its share:
//! a producer thread loads TMA boxes of 8 row tiles of the tiled weights (and the tokens'
//! columns) into a shared-memory pipeline, a consumer warpgroup multiplies them; the gate/up
//! kernel (one block an SM, after the same routing) writes each token's `g[t, e] · silu(gate)
//! ⊙ up` for every selected expert — zero where it did not choose `e` — so that the down
//! kernel is one GEMM over the selected experts' concatenated columns, a cluster per 128
//! output rows splitting them and `cluster::reduce_scatter` summing in rank order. The
//! gate weights reach the epilogues through a [`Published`] table (the kernel is
//! persistent). The *dense* schedule, for so many tokens that every expert is chosen anyway,
//! is the same with every expert's rows in both kernels: no block then needs the routing
//! before its first unit's epilogue, so a few clusters route 8 tokens each while the others
//! already stream, and the down kernel needs none — the routing's tens of microseconds at
//! 64 tokens overlap the weights' stream instead of preceding it.
//!
//! The *fused* schedule, for few tokens on few units ([`fn@moe_fused`], one launch), splits
//! the down projection along the FFN features instead of running it after the gate and up
//! projections: each block takes the tokens schedule's units (128 features of a selected
//! expert), and once a unit's `h` is in its shared memory it streams the same 128 columns of
//! the expert's `W_down` through the same pipeline and multiplies them with it, adding the
//! product to the block's partial `y`. No block waits for another's `h`, and no second
//! launch streams the down weights after the first has drained; the blocks' partials meet
//! once, at the end ([`Published`]), summed in block order. At one token the HBM would idle
//! until the routing is ready, so while the cluster exchanges the logits each block asks L2
//! for the first bytes of the units its own largest logits make likely (16 MiB a step over
//! all clusters, [`fn@prefetch_likely_units`]); the chosen experts' share is then read from
//! L2.
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
//! let plan = plan(&kernels, &gpu, moe.layer, moe.tokens, true)?; // the down launch programmatic
//! step(&kernels, gpu.stream(), &mut buffers, &plan)?;
//! let (y, experts, gates) = buffers.results(&gpu)?;
//! # let _ = (y, experts, gates); Ok(()) }
//! ```

use clusterfuse::arch;
use clusterfuse::cluster::Cluster;
use clusterfuse::global::L2Policy;
use clusterfuse::mbarrier::Mailbox;
use clusterfuse::mma::{mma_m16n8k16, FragA, FragB, FragC};
use clusterfuse::ops::{rank_key, rank_unkey};
use clusterfuse::prelude::*;
use clusterfuse::shared::DynamicShared;
use crate::decode::load_words_out;
use crate::wgmma_gemm::consume;
use clusterfuse::tma::{Pipeline, PipelineState, TensorMap};
use clusterfuse::warpgroup::{swizzle_128b, AccM64N256, AccM64N64, AccM64N8, Operand, Warpgroup};

/// Tokens a routing cluster of the dense schedule routes (the others stream meanwhile): the
/// gate table's tile, `ROUTER_TOKENS × experts`.
pub const ROUTER_TOKENS: usize = 8;

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
/// K-steps whose loads a staged gate/up warp issues together (the warp schedule's:
/// [`gate_up_unroll`]); a layer's hidden size is a whole number of such chunks.
const GATE_UP_UNROLL: usize = 4;
/// K-steps whose loads the down kernel issues together, times its n-tiles (8 spills 800
/// bytes at 128 registers).
const DOWN_UNROLL: usize = 6;

/// Points of a block's timeline (a kernel's `timeline` argument, `blocks × 4` values, or
/// one value when off; [`host::Timeline`]): its start, its router logits summed (the gate/up
/// kernels), its routing ready (computed, or received by a down kernel), its end.
pub const TIMELINE_POINTS: usize = 4;

/// Stamps point `point` of this block's timeline, if thread 0 of the block.
#[inline(always)]
fn stamp(timeline: &Out<u64>, point: usize) {
    if timeline.len() > 1 && thread::rank_in_block() == 0 {
        crate::stamp(timeline, TIMELINE_POINTS, point);
    }
}

/// Longest row whose top `k` a warp finds by ranking every key ([`warp_top_k`]): two keys
/// a lane.
const RANKED_ROW: usize = 64;

/// The `k` largest of `len` distinct nonzero [`rank_key`]s (`key_at(i)`), largest first:
/// `emit(j, key)` for each place `j < k`, by one lane (key 0 for places past `len`). Keys
/// of equal value must come in index order (both callers list them so), so that up to
/// [`RANKED_ROW`] keys rank by value and position alone: they sit in registers (keys `lane`
/// and `lane + 32`), and each lane counts the keys above its own as every value is
/// broadcast in turn — one 32-bit shuffle a key, no branches and no shared-memory round trips
/// (a lane loading and comparing the keys itself, bounds-checked, took a third of a
/// 64-token routing's time). Longer rows take `k` rounds of [`warp::reduce_max_u64`].
#[inline(always)]
fn warp_top_k(len: usize, k: usize, key_at: impl Fn(usize) -> u64, mut emit: impl FnMut(usize, u64)) {
    let lane = warp::lane() as usize;
    if len <= RANKED_ROW {
        let key = |i: usize| if i < len { key_at(i) } else { 0 };
        let (low, high) = (key(lane), key(lane + 32));
        let value = |key: u64| (key >> 32) as u32;
        // Scalars, not arrays: an array indexed in a loop lives in local memory.
        let (mut low_place, mut high_place) = (0, 0);
        let mut rank_against = |half: usize, keys: u64| {
            // A bound the same for every lane; broadcasts past `len` carry key 0's value,
            // which outranks no key.
            for first in (0..(len - 32 * half).min(32)).step_by(8) {
                unroll!(u in [0 1 2 3 4 5 6 7] {
                    let src = first + u;
                    let other = warp::broadcast(value(keys), src as u32);
                    let at = 32 * half + src;
                    low_place += usize::from(other > value(low) || (other == value(low) && at < lane));
                    high_place += usize::from(other > value(high) || (other == value(high) && at < lane + 32));
                });
            }
        };
        rank_against(0, low);
        if len > 32 {
            rank_against(1, high);
        }
        for (key, place) in [(low, low_place), (high, high_place)] {
            if key != 0 && place < k {
                emit(place, key);
            }
        }
    } else {
        let mut bound = u64::MAX;
        for j in 0..k.min(len) {
            let mut best = 0;
            for i in (lane..len).step_by(32) {
                let key = key_at(i);
                if key < bound && key > best {
                    best = key;
                }
            }
            bound = warp::reduce_max_u64(best);
            if lane == 0 {
                emit(j, bound);
            }
        }
    }
    if len + lane < k {
        emit(len + lane, 0);
    }
}

/// Each row's `k` largest values over the cluster, as [`rank_key`]s, largest first, in `top`
/// (`rows × k`) of every block, and with `normalizers`, each row's softmax denominator
/// `Σ exp(v − max)` over the whole row in `normalizers[row]`: block `r` holds columns
/// `r·n .. (r + 1)·n` of each row in `values` (`rows × n`, row-major), and a key's index is
/// its column in the whole row. Ties go to the lower index. `mailbox` (at least
/// `rows × cluster::size() × (k + 1)` words, made before the call) carries the blocks'
/// candidates; `k ≤ 32` and `cluster::size() ≤ 32`. Every thread of every block calls it,
/// after the block has written `values`; `top` and `normalizers` are ready in every thread on
/// return, and the mailbox may serve the next call.
///
/// One cluster barrier, whose arrival orders no memory: it tells each block that its peers
/// exist, have made their mailboxes and are done reading them. With `normalizers`, the
/// block's `(max, Σ exp(v − max))` of each row goes into every block's mailbox (`st.async`):
/// a warp a row, its lanes splitting the row, where the rows are no more than the warps; else
/// a thread a row, all rows at once (a warp a row, rows in turn, made 64 DeepSeek tokens'
/// routing 8 µs slower). Each warp takes rows round robin, finds the row's local top `k`
/// ([`warp_top_k`]: each key ranked against the row's others) and posts it. Once its own
/// mailbox has every peer's words, a thread a row sums the normalisers in rank order and each
/// warp merges a row's `size · k` candidates the same way. (A releasing barrier after
/// ordinary DSMEM stores costs a `MEMBAR.ALL.GPU` on sm_90: this replaced three of them, and
/// the softmax's own `cluster::reduce` two more.)
#[cluster_primitive(barriers = 1)]
pub fn top_k(_scope: &Cluster, values: SharedSlice<f32>, rows: usize, k: usize, mailbox: &mut Mailbox, top: SharedSlice<u64>, normalizers: Option<SharedSlice<f32>>) {
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    let sent = k + usize::from(normalizers.is_some());
    let words = mailbox.words();
    if k == 0 || k > 32 || size > 32 || rows == 0 || words.len() < rows * size * sent || top.len() < rows * k || normalizers.is_some_and(|sums| sums.len() < rows) {
        arch::trap();
    }
    let n = values.len() / rows;
    let (warp, warps) = (warp::index_in_block() as usize, block::warps() as usize);
    if thread::rank_in_block() == 0 {
        mailbox.expect(rows * size * sent);
    }
    // `values` written (the block's threads), and the peers ready to receive.
    block::sync();
    cluster::arrive_relaxed();
    cluster::wait();
    let post = |at: usize, word: u64| {
        for peer in 0..size as u32 {
            mailbox.post(peer, at, word);
        }
    };
    // Row `row`'s candidates from block `r` at `(row · size + r) · k`, its normalisers after
    // all candidates, at `rows · size · k + row · size + r`.
    let sums_at = rows * size * k;
    // The softmax's partial sums: with no more rows than warps, warp `w` row `w`, its lanes
    // splitting it (at 1 DeepSeek token a thread's serial pass over its block's 16 logits
    // took 2.0 µs; the warp's brought the routing from 11.3 to 11.0 µs); with more, a thread
    // a row, all rows at once.
    if normalizers.is_some() {
        // This thread's share of row `row`, columns `first, first + step, ..`: their max, and
        // their sum of `exp(v − max)` for a given max.
        let own = |row: usize, first: usize, step: usize| (first..n).step_by(step).map(move |i| values.load(row * n + i));
        let own_max = |row, first, step| own(row, first, step).fold(f32::NEG_INFINITY, f32::max);
        let own_sum = |row, first, step, max: f32| own(row, first, step).map(|v| math::exp(v - max)).sum::<f32>();
        let post_partial = |row: usize, max: f32, sum: f32| post(sums_at + row * size + rank, ((sum.to_bits() as u64) << 32) | max.to_bits() as u64);
        if rows <= warps {
            if warp < rows {
                let lane = warp::lane() as usize;
                let max = warp::reduce_max(own_max(warp, lane, 32));
                let sum = warp::reduce_sum(own_sum(warp, lane, 32, max));
                if lane == 0 {
                    post_partial(warp, max, sum);
                }
            }
        } else {
            for row in block::stride_loop(0..rows) {
                let max = own_max(row, 0, 1);
                post_partial(row, max, own_sum(row, 0, 1, max));
            }
        }
    }
    for row in (warp..rows).step_by(warps) {
        let at = (row * size + rank) * k;
        let key_at = |i: usize| rank_key(values.load(row * n + i), (rank * n + i) as u32);
        warp_top_k(n, k, key_at, |j, best| post(at + j, best));
    }
    mailbox.wait();
    if let Some(sums) = normalizers {
        for row in block::stride_loop(0..rows) {
            // Block `r`'s (max, sum), each sum rescaled to the row's max, in rank order.
            let partial = |r: usize| {
                let word = words.load(sums_at + row * size + r);
                (f32::from_bits(word as u32), f32::from_bits((word >> 32) as u32))
            };
            let row_max = (0..size).map(|r| partial(r).0).fold(f32::NEG_INFINITY, f32::max);
            sums.store(row, (0..size).map(|r| partial(r).1 * math::exp(partial(r).0 - row_max)).sum());
        }
    }
    for row in (warp..rows).step_by(warps) {
        warp_top_k(size * k, k, |i| words.load(row * size * k + i), |j, best| top.store(row * k + j, best));
    }
    // `top` and `normalizers` written by other warps.
    block::sync();
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

    /// Cluster 0's first block hands the routing to the down kernel (`routing`, `pair_gate`)
    /// and the host (`top_ids`, `top_gates`: each token's choices `ids` and gate weights).
    fn hand_over(self, ids: SharedSlice<u32>, gates: SharedSlice<f32>, routing: &Out<u32>, pair_gate: &Out<f32>, top_ids: &Out<u32>, top_gates: &Out<f32>) {
        if cluster::index_in_grid().x == 0 && cluster::block_rank() == 0 {
            let experts = self.count.len();
            for e in block::stride_loop(0..experts) {
                routing.set(e, self.count.load(e));
            }
            for p in block::stride_loop(0..self.pair_token.len()) {
                routing.set(experts + p, self.pair_token.load(p));
                pair_gate.set(p, self.pair_gate.load(p));
                top_ids.set(p, ids.load(p));
                top_gates.set(p, gates.load(p));
            }
        }
    }

    fn items(self) -> usize {
        self.items.load(0) as usize
    }

    /// The down kernel's copy of the routing the gate/up kernel handed over (`routing`: each
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
/// `timeline`: the logits' point. The pairs schedule's kernels call it, the tokens
/// schedule's [`route_tokens`], the same code: ptxas allocates a kernel's registers around
/// the functions it calls, and one function shaped by both schedules' calls spilled the
/// pairs kernels' streaming loops (inlined into the tokens kernel, it slowed that one's).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn route(smem: &mut DynamicShared, x: &[bf16], router: &[bf16], tokens: usize, k: usize, renormalize: bool, group: usize, timeline: &Out<u64>) -> (Dispatch, SharedSlice<u32>, SharedSlice<f32>) {
    route_body::<4>(smem, x, router, tokens, k, renormalize, group, timeline, |_| ())
}

/// [`route`] for the tokens schedule's kernels: at up to 8 tokens, each warp's logits in one
/// memory round trip (8 K-steps' loads at once, which its 255 registers hold).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn route_tokens(smem: &mut DynamicShared, x: &[bf16], router: &[bf16], tokens: usize, k: usize, renormalize: bool, timeline: &Out<u64>) -> (Dispatch, SharedSlice<u32>, SharedSlice<f32>) {
    route_body::<8>(smem, x, router, tokens, k, renormalize, MAX_TOKENS, timeline, |_| ())
}

/// [`route_tokens`] for the fused kernel, whose one-token routing asks L2 for the likely
/// units while the cluster exchanges the logits ([`prefetch_likely_units`] with `weights`,
/// the gate and up weights of `tiles` units an expert, `steps` K-steps a row).
#[allow(clippy::too_many_arguments)]
#[inline(never)]
fn route_fused(smem: &mut DynamicShared, x: &[bf16], router: &[bf16], tokens: usize, k: usize, renormalize: bool, timeline: &Out<u64>, weights: [&[bf16]; 2], tiles: usize, steps: usize) -> (Dispatch, SharedSlice<u32>, SharedSlice<f32>) {
    route_body::<8>(smem, x, router, tokens, k, renormalize, MAX_TOKENS, timeline, |logits| prefetch_likely_units(logits, k, weights, tiles, steps))
}

/// [`route`]'s body, the router logits of up to 8 tokens `STEPS_AT_ONCE` K-steps at a time.
/// At one token, every thread calls `while_exchanged` with the block's logits while the
/// cluster exchanges them ([`route_one_token`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn route_body<const STEPS_AT_ONCE: usize>(
    smem: &mut DynamicShared,
    x: &[bf16],
    router: &[bf16],
    tokens: usize,
    k: usize,
    renormalize: bool,
    group: usize,
    timeline: &Out<u64>,
    while_exchanged: impl FnOnce(SharedSlice<f32>),
) -> (Dispatch, SharedSlice<u32>, SharedSlice<f32>) {
    let hidden = x.len() / tokens;
    let experts = router.len() / hidden;
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    let local = experts / size;
    let lane = warp::lane() as usize;
    let logits = smem.take::<f32>(tokens * local);
    let partials = smem.take::<f32>(WARPS * ROWS * tokens.next_multiple_of(8));
    let normalizers = (!renormalize).then(|| smem.take::<f32>(tokens));
    // Made before the logits, so that `top_k`'s one barrier also covers its mbarrier's init.
    // SAFETY: fresh shared memory; the cluster barrier of `top_k` or `route_one_token` comes
    // before any block posts.
    let mut mailbox = unsafe { Mailbox::new(smem.take::<u64>(mailbox_words(tokens, experts, size, k)), smem.take::<u64>(1)) };
    let top = smem.take::<u64>(tokens * k);
    let (ids, gates) = (smem.take::<u32>(tokens * k), smem.take::<f32>(tokens * k));
    let masks = smem.take::<u32>(2 * experts);
    let dispatch = Dispatch::take(smem, experts, tokens * k);

    // Zeroed for the atomics after `top_k` (the logits' block barriers order them first).
    for e in block::stride_loop(0..experts) {
        masks.store(2 * e, 0);
        masks.store(2 * e + 1, 0);
        dispatch.count.store(e, 0);
    }

    // Logits of this block's experts on tensor cores: A = their router rows (16 a tile,
    // zeros past the last), B = the tokens (8 an n-tile); the warps split the K-steps, and the
    // block sums their tiles in warp order.
    let n_tiles = tokens.div_ceil(8);
    for m in (0..local).step_by(ROWS) {
        let row = |r: usize| (m + r < local).then_some(rank * local + m + r);
        let rows = [row(lane / 4), row(lane / 4 + 8)];
        match n_tiles {
            1 => router_tile::<1, STEPS_AT_ONCE>(x, router, tokens, rows, 0, partials),
            2 => router_tile::<2, 4>(x, router, tokens, rows, 0, partials),
            _ => (0..n_tiles).step_by(4).for_each(|first| router_tile::<4, 2>(x, router, tokens, rows, first, partials)),
        }
        block::sync();
        for i in block::stride_loop(0..ROWS.min(local - m) * tokens) {
            let (r, t) = (i / tokens, i % tokens);
            let sum = (0..WARPS).map(|w| partials.load(((w * n_tiles + t / 8) * ROWS + r) * 8 + t % 8)).sum::<f32>();
            logits.store(t * local + m + r, sum);
        }
        block::sync();
    }
    stamp(timeline, 1);
    if tokens == 1 && experts <= RANKED_ROW {
        route_one_token(logits, k, renormalize, &mut mailbox, top, ids, gates, dispatch, while_exchanged);
        return (dispatch, ids, gates);
    }
    top_k(&Cluster::new(), logits, tokens, k, &mut mailbox, top, normalizers);

    // A thread a (token, place) pair: its expert, its gate weight — exp(l − max) over the top
    // k, or over all experts (`top_k`'s normalisers) — and its token's bit in the expert's
    // mask and count (shared atomics: the same result in any order). One pass, no serial
    // loop per token: at 1 token the routing is a chain of such short steps.
    for p in block::stride_loop(0..tokens * k) {
        let t = p / k;
        let max = rank_unkey(top.load(t * k)).0;
        let total = match normalizers {
            Some(sums) => sums.load(t),
            None => (0..k).map(|j| math::exp(rank_unkey(top.load(t * k + j)).0 - max)).sum(),
        };
        let (logit, e) = rank_unkey(top.load(p));
        ids.store(p, e);
        gates.store(p, math::exp(logit - max) / total);
        masks.atomic_or(2 * e as usize + t / 32, 1 << (t % 32));
        dispatch.count.atomic_add(e as usize, 1);
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

/// Words of [`route_body`]'s mailbox: [`top_k`]'s candidates and normalisers, or for one token
/// every expert's logit ([`route_one_token`]).
const fn mailbox_words(tokens: usize, experts: usize, cluster: usize, k: usize) -> usize {
    let candidates = tokens * cluster * (k + 1);
    if candidates > experts { candidates } else { experts }
}

/// [`route_body`] after the logits for a single token (at most [`RANKED_ROW`] experts, this
/// block's in `logits`): each block posts its experts' logits as [`rank_key`]s into every
/// block's mailbox (`st.async`, after one cluster barrier), and warp 0 of each block ranks
/// them all at once ([`warp_top_k`]) and derives the gate weights, the pairs (one an expert)
/// and the items with shuffles — in place of [`top_k`]'s two rankings, its normalisers'
/// exchange and the block passes after it (gates, item list, pairs' places), a chain of
/// dependent steps that took 6.6 µs at one DeepSeek token. Every thread calls
/// `while_exchanged(logits)` between its arrival at the cluster barrier and its wait there.
/// Ends with a block barrier.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn route_one_token(
    logits: SharedSlice<f32>,
    k: usize,
    renormalize: bool,
    mailbox: &mut Mailbox,
    top: SharedSlice<u64>,
    ids: SharedSlice<u32>,
    gates: SharedSlice<f32>,
    dispatch: Dispatch,
    while_exchanged: impl FnOnce(SharedSlice<f32>),
) {
    let (rank, size, local) = (cluster::block_rank() as usize, cluster::size() as usize, logits.len());
    let experts = local * size;
    let words = mailbox.words();
    if thread::rank_in_block() == 0 {
        mailbox.expect(experts);
    }
    // `logits` written (the block's threads), and the peers ready to receive.
    block::sync();
    cluster::arrive_relaxed();
    while_exchanged(logits);
    cluster::wait();
    for i in block::stride_loop(0..local) {
        let e = rank * local + i;
        let key = rank_key(logits.load(i), e as u32);
        for peer in 0..size as u32 {
            mailbox.post(peer, e, key);
        }
    }
    mailbox.wait();
    if warp::index_in_block() == 0 {
        let lane = warp::lane() as usize;
        warp_top_k(experts, k, |e| words.load(e), |j, best| top.store(j, best));
        warp::sync();
        let max = rank_unkey(top.load(0)).0;
        let term = |logit: f32| math::exp(logit - max);
        let chosen = (lane < k).then(|| rank_unkey(top.load(lane)));
        // The softmax's denominator: over the chosen experts, or over all of them.
        let part = if renormalize {
            chosen.map_or(0.0, |(logit, _)| term(logit))
        } else {
            let term_of = |e: usize| if e < experts { term(rank_unkey(words.load(e)).0) } else { 0.0 };
            term_of(lane) + term_of(lane + 32)
        };
        let total = warp::reduce_sum(part);
        // A chosen expert's pair: the chosen of lower index come before it.
        let expert = chosen.map_or(u32::MAX, |(_, e)| e);
        let place = (0..k).filter(|&j| warp::broadcast(expert, j as u32) < expert).count();
        if let Some((logit, e)) = chosen {
            let gate = term(logit) / total;
            ids.store(lane, e);
            gates.store(lane, gate);
            dispatch.count.store(e as usize, 1);
            dispatch.offset.store(e as usize, place as u32);
            dispatch.pair_token.store(place, 0);
            dispatch.pair_gate.store(place, gate);
            dispatch.items.store(1 + place, e << 16);
        }
        if lane == 0 {
            dispatch.items.store(0, k as u32);
        }
    }
    block::sync();
}

/// A warp's share of one 16-row tile of router logits: router rows `rows` (this lane's two,
/// or none) times the tokens of n-tiles `first .. first + NT`, over every 8th K-step from the
/// warp's, into `partials` at `((warp · n-tiles + n) · 16 + row) · 8 + column`. Each chunk
/// issues the loads of `U` steps for the `NT` n-tiles before its `mma`s: the router rows once
/// per step, not once per n-tile, and one memory round trip per chunk. (8 n-tiles at once
/// spill at 128 registers: 5-8 take two calls.)
#[inline(always)]
fn router_tile<const NT: usize, const U: usize>(x: &[bf16], router: &[bf16], tokens: usize, rows: [Option<usize>; 2], first: usize, partials: SharedSlice<f32>) {
    let hidden = x.len() / tokens;
    let (steps, n_tiles) = (hidden / STEP, tokens.div_ceil(8));
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let mut acc = [FragC::ZERO; NT];
    for chunk in (warp..steps).step_by(WARPS * U) {
        let mut a = [[[0u32; 4]; 2]; U];
        let mut b = [[[0u32; 4]; NT]; U];
        unroll!(u in [0 1 2 3 4 5 6 7] {
            let s = chunk + u * WARPS;
            if u < U && s < steps {
                // SAFETY: rows of the router and of `x` (or none), `s < steps`; both are
                // inputs.
                let load = |w: &[bf16], r: Option<usize>| r.map_or([0; 4], |r| unsafe { row_words(w, r, hidden, s) });
                a[u] = [load(router, rows[0]), load(router, rows[1])];
                for (n, b) in b[u].iter_mut().enumerate() {
                    let t = 8 * (first + n) + lane / 4;
                    *b = load(x, (t < tokens).then_some(t));
                }
            }
        });
        unroll!(u in [0 1 2 3 4 5 6 7] {
            if u < U && chunk + u * WARPS < steps {
                for (n, acc) in acc.iter_mut().enumerate() {
                    if first + n < n_tiles {
                        *acc = mma_step(a[u], b[u][n], *acc);
                    }
                }
            }
        });
    }
    for (n, acc) in acc.iter().enumerate().take(n_tiles - first) {
        for v in 0..4 {
            let (r, c) = FragC::position(v);
            partials.store(((warp * n_tiles + first + n) * ROWS + r) * 8 + c, acc.values[v]);
        }
    }
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
/// 512-byte runs and a row tile as one contiguous stream; evict-first in L2 (read once a step).
///
/// # Safety
/// 1. `(tile · steps + s + 1) · 512 <= w.len()`.
/// 2. No grid writes `w` while the kernel runs, nor one it was launched programmatically after.
/// 3. `w` starts 16-byte aligned (a whole kernel argument: allocations are 256-byte aligned).
#[inline(always)]
unsafe fn tile_words(w: &[bf16], tile: usize, steps: usize, s: usize) -> [[u32; 4]; 2] {
    let at = (tile * steps + s) * 64 + warp::lane() as usize;
    let policy = L2Policy::evict_first();
    [global::load16_invariant_hinted_unchecked::<u32, 4>(words(w), at, policy), global::load16_invariant_hinted_unchecked::<u32, 4>(words(w), at + 32, policy)]
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
/// — with groups of 8 on the staged schedule ([`gate_up_staged`]: a block's warps on 8 row
/// tiles of one item, the item's `x` staged in shared memory), with 16 or 32 a unit a warp
/// ([`gate_up_warps`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gate_up<const NT: usize>(
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
    timeline: &Out<u64>,
) {
    stamp(timeline, 0);
    grid::launch_dependents();
    let tokens = top_ids.len() / k;
    let hidden = x.len() / tokens;
    let ffn = h.len() / (tokens * k);
    let experts = router.len() / hidden;
    if !hidden.is_multiple_of(STEP * GATE_UP_UNROLL) || !ffn.is_multiple_of(ROWS) || w_gate.len() != experts * ffn * hidden || w_up.len() != w_gate.len() {
        arch::trap();
    }
    let mut smem = shared::dynamic();
    let (dispatch, ids, gates) = route(&mut smem, x, router, tokens, k, renormalize, 8 * NT, timeline);
    dispatch.hand_over(ids, gates, routing, pair_gate, top_ids, top_gates);
    stamp(timeline, 2);
    let shape = GateUp { x, w_gate, w_up, h, hidden, ffn };
    if NT == 1 {
        gate_up_staged(&mut smem, dispatch, &shape);
    } else {
        gate_up_warps::<NT>(dispatch, &shape);
    }
    // The block's end: its last warp's.
    if timeline.len() > 1 {
        block::sync();
        stamp(timeline, 3);
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

/// K-steps whose loads a warp-schedule gate/up warp with `nt` n-tiles issues together: as
/// many as 128 registers hold beside `x` and the accumulators (4 with 2 n-tiles issued only
/// half their loads before the first `mma`). 3 need not divide a unit's steps: the last
/// chunk then guards its steps.
const fn gate_up_unroll(nt: usize) -> usize {
    if nt == 2 { 3 } else { GATE_UP_UNROLL / 2 }
}

/// The gate/up units a warp at a time (groups of 16 and 32 pairs): unit `q` (16 rows of an
/// item) goes to warp `q / blocks` of block `q % blocks`, so that few units still spread
/// over every SM; the warp streams its rows and its pairs' `x` from global memory (`x` from
/// L2), [`gate_up_unroll`] K-steps' loads at once.
#[inline(always)]
fn gate_up_warps<const NT: usize>(dispatch: Dispatch, op: &GateUp) {
    let GateUp { x, w_gate, w_up, hidden, ffn, .. } = *op;
    let group_pairs = 8 * NT;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let (tiles, steps) = (ffn / ROWS, hidden / STEP);
    let blocks = grid::dim().x as usize;
    let unroll = gate_up_unroll(NT);
    let units = dispatch.items() * tiles;
    for q in (warp * blocks + block::index_x() as usize..units).step_by(WARPS * blocks) {
        let item = dispatch.item(q / tiles, group_pairs);
        let tile = item.expert * tiles + q % tiles;
        // The lane's pair column in each n-tile: its token's row of `x`, if it has one.
        let x_rows: [Option<usize>; NT] = core::array::from_fn(|n| {
            let p = 8 * n + lane / 4;
            (p < item.len).then(|| dispatch.pair_token.load(item.first + p) as usize)
        });
        let mut acc = [[FragC::ZERO; NT]; 2];
        for chunk in (0..steps).step_by(unroll) {
            let mut a = [[[[0u32; 4]; 2]; 2]; GATE_UP_UNROLL];
            let mut b = [[[0u32; 4]; NT]; GATE_UP_UNROLL];
            unroll!(u in [0 1 2 3] {
                if u < unroll && (GATE_UP_UNROLL.is_multiple_of(unroll) || chunk + u < steps) {
                    let s = chunk + u;
                    // SAFETY: `tile` is a row tile of the expert's (checked lengths), and `s <
                    // steps`; weights and `x` are inputs.
                    unsafe {
                        a[u] = [tile_words(w_gate, tile, steps, s), tile_words(w_up, tile, steps, s)];
                        for n in 0..NT {
                            if let Some(t) = x_rows[n] {
                                b[u][n] = row_words(x, t, hidden, s);
                            }
                        }
                    }
                }
            });
            unroll!(u in [0 1 2 3] {
                if u < unroll && (GATE_UP_UNROLL.is_multiple_of(unroll) || chunk + u < steps) {
                    for n in 0..NT {
                        acc[0][n] = mma_step(a[u][0], b[u][n], acc[0][n]);
                        acc[1][n] = mma_step(a[u][1], b[u][n], acc[1][n]);
                    }
                }
            });
        }
        op.write(&acc, item, q % tiles);
    }
}

/// Words of shared memory a row of `cols` halves takes when staged: 64 bytes more than the
/// row, so that the 8 lanes of a quarter warp, reading 16 bytes each of two rows, hit 32
/// different banks.
const fn padded_row_words(cols: usize) -> usize {
    cols / 2 + 16
}

/// K columns of the pairs' `x` a staged gate/up block holds in shared memory at once.
const WINDOW: usize = 1024;

/// Columns of a staged gate/up window: [`WINDOW`], or all of a narrower `hidden`.
const fn window_columns(hidden: usize) -> usize {
    if hidden < WINDOW { hidden } else { WINDOW }
}

/// The gate/up units a block at a time (groups of 8 pairs): a *block unit* is 8 row tiles
/// of one item, one a warp. The block copies the item's pairs' `x` into shared memory a
/// window of [`WINDOW`] columns at a time (`cp.async`, all threads), so that the pairs'
/// vectors cross from L2 once per block unit instead of once per warp, and a warp's
/// registers hold only its weight loads and accumulators; each warp then streams its 16
/// rows of the window, [`GATE_UP_UNROLL`] K-steps' loads at once, reading B from shared
/// memory as each `mma` needs it.
#[inline(always)]
fn gate_up_staged(smem: &mut DynamicShared, dispatch: Dispatch, op: &GateUp) {
    let GateUp { x, w_gate, w_up, hidden, ffn, .. } = *op;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let (tiles, steps) = (ffn / ROWS, hidden / STEP);
    let row_words = padded_row_words(window_columns(hidden));
    let window_steps = window_columns(hidden) / STEP;
    let staged = smem.take::<u32>(8 * row_words);
    // SAFETY: `x` is a whole kernel argument.
    let x_words = unsafe { words(x) };
    let per_item = tiles.div_ceil(WARPS);
    let units = dispatch.items() * per_item;
    for unit in (block::index_x() as usize..units).step_by(grid::dim().x as usize) {
        let item = dispatch.item(unit / per_item, 8);
        let row_tile = unit % per_item * WARPS + warp;
        // A warp past the expert's last row tile streams nothing but meets the barriers.
        let live = row_tile < tiles;
        let tile = item.expert * tiles + row_tile;
        let mut acc = [[FragC::ZERO; 1]; 2];
        for start in (0..steps).step_by(window_steps) {
            let pieces = window_steps.min(steps - start) * STEP / 8;
            // The last window's (or unit's) readers are done with the slots.
            block::sync();
            for i in block::stride_loop(0..item.len * pieces) {
                let (p, c) = (i / pieces, i % pieces);
                let token = dispatch.pair_token.load(item.first + p) as usize;
                staged.copy16_async::<4>(p * row_words / 4 + c, x_words, (token * hidden + start * STEP) / 8 + c);
            }
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
                    let p = lane / 4;
                    let b = if p < item.len { staged.load16::<4>(p * row_words / 4 + (chunk + u - start) * STEP / 8 + lane % 4) } else { [0; 4] };
                    acc[0][0] = mma_step(a[u][0], b, acc[0][0]);
                    acc[1][0] = mma_step(a[u][1], b, acc[1][0]);
                });
            }
        }
        if live {
            op.write(&acc, item, row_tile);
        }
    }
}

/// The down kernel, for groups of `8 · NT` pairs.
#[inline(always)]
fn down<const NT: usize>(h: &Out<bf16>, routing: &Out<u32>, pair_gate: &Out<f32>, w_down: &[bf16], out: &Out<bf16>, k: usize, timeline: &Out<u64>) {
    stamp(timeline, 0);
    // Sizes: `pair_gate` holds `tokens · k` values, `routing` `experts + tokens · k`, `h`
    // `tokens · k` rows of `ffn`, `out` `tokens` rows of `hidden`.
    let tokens = pair_gate.len() / k;
    let hidden = out.len() / tokens;
    let ffn = h.len() / (tokens * k);
    let experts = routing.len() - tokens * k;
    if !ffn.is_multiple_of(STEP) || !hidden.is_multiple_of(ROWS) || w_down.len() != experts * hidden * ffn {
        arch::trap();
    }
    let group = 8 * NT;
    let mut smem = shared::dynamic();
    let dispatch = Dispatch::take(&mut smem, experts, tokens * k);
    // Each warp's per-token sums of the rows: `warp × ROWS × tokens`.
    let sums = smem.take::<f32>(WARPS * ROWS * tokens);
    let total = smem.take::<f32>(ROWS * tokens);
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    dispatch.receive(routing, pair_gate, group);
    stamp(timeline, 2);

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
    stamp(timeline, 3);
}

/// Rows of a *tokens-schedule* block tile: 128 rows of the gate and up projections (so 128
/// features of `h`), or of the down projection's output; 8 row tiles of the tiled weights.
pub const TILE_ROWS: usize = 128;
/// Row tiles of the tiled weights in a tokens-schedule block tile.
const TILE_ROW_TILES: usize = TILE_ROWS / ROWS;
/// K-steps (of 32 columns) in a tokens-schedule pipeline stage: gate/up's 1 (so that 7
/// stages fit beside the routing's shared memory), down's 2 (larger boxes: each TMA box costs
/// about the same time whatever its size).
const GATE_UP_STAGE_STEPS: usize = 1;
const DOWN_STAGE_STEPS: usize = 2;
/// Bytes of a stage's weights of one projection with `steps` K-steps a stage: a TMA box of 8
/// row tiles × `steps` K-steps.
const fn weight_box_bytes(steps: usize) -> u32 {
    (TILE_ROWS * steps * STEP * 2) as u32
}
/// Bytes of a stage's tokens operand (`x` or `h`): a TMA box of 64 rows (every token, zeros
/// past the last) × `32 steps` columns.
const fn tokens_box_bytes(steps: usize) -> u32 {
    (MAX_TOKENS * steps * STEP * 2) as u32
}
/// Pipeline stages of the tokens-schedule kernels: gate/up's hold 20 KB (both projections'
/// 128 rows and `x`), down's 24 KB (its 128 rows and `h`).
pub const GATE_UP_TOKENS_STAGES: usize = 7;
pub const DOWN_TOKENS_STAGES: usize = 5;
const GATE_UP_TOKENS_STAGE_BYTES: u32 = 2 * weight_box_bytes(GATE_UP_STAGE_STEPS) + tokens_box_bytes(GATE_UP_STAGE_STEPS);
const DOWN_TOKENS_STAGE_BYTES: u32 = weight_box_bytes(DOWN_STAGE_STEPS) + tokens_box_bytes(DOWN_STAGE_STEPS);

/// Issues the TMA load of stage `stage` (K-steps `steps · stage ..`, `steps` of them) of the 8 row tiles
/// `first ..` (of all experts' stacked row tiles) of tiled weights (`map`: [`host`]'s view of
/// each row tile as a plane of rows of 64 elements, 128 bytes, so that each 16 × 32 tile is 8
/// such rows — row `j` holding the tile's rows `2j` (K 0-31 of the view) and `2j + 1` (K
/// 32-63) — under the 128-byte swizzle, in boxes of `steps` tiles of 8 row tiles: its tiles
/// 1 KB apart in K-step order inside each row tile, the row tiles `steps` KB apart) into
/// `dst`, on the barrier `full` — evict-first in L2: a step reads each weight once, and its
/// lines would otherwise push out the activations and the kernels' code.
///
/// # Safety
/// As [`clusterfuse::tma::TensorMap::load_3d`], for [`weight_box_bytes`]`(steps)` at `dst`.
#[inline(always)]
unsafe fn load_weights(map: TensorMap, dst: u32, first: usize, stage: usize, steps: usize, full: u32) {
    map.load_3d_hinted(dst, 0, (stage * steps * ROWS / 2) as i32, first as i32, full, L2Policy::evict_first());
}

/// The weight row (of 128) that row `m` of a [`weight_operand`] of `parity` holds: row `2
/// (m % 8)` (+ 1 when odd) of tile `m / 8`.
#[inline(always)]
fn weight_row(m: usize, parity: usize) -> usize {
    ROWS * (m / 8) + 2 * (m % 8) + parity
}

/// The tokens schedule's `wgmma` A operand for the 16 columns `16 kk ..` (`kk` < `2 steps`)
/// of a stage of `steps` K-steps: the 64 even (`parity` 0) or odd weight rows of the 8 row
/// tiles of the [`load_weights`] box at `tiles` (a view row's K 0-31 are its even weight row,
/// K 32-63 its odd one; groups of 8 view rows, one tile, `steps` KB apart).
#[inline(always)]
fn weight_operand(tiles: u32, parity: u32, kk: u32, steps: usize) -> Operand<bf16> {
    let tile_bytes = weight_box_bytes(1) / TILE_ROW_TILES as u32;
    Operand::k_major_swizzle_128b(tiles + kk / 2 * tile_bytes, 32 * parity + 16 * (kk % 2)).group_stride(steps as u32 * tile_bytes)
}

/// The tokens schedule's `wgmma` B operand for the 16 columns `16 kk ..` of a stage of
/// `steps` (1 or 2) K-steps: the 64 token rows TMA loaded at `tokens` (rows of `64 steps`
/// bytes, swizzled as wide).
#[inline(always)]
fn tokens_operand(tokens: u32, kk: u32, steps: usize) -> Operand<bf16> {
    if steps == 1 { Operand::k_major_swizzle_64b(tokens, 16 * kk) } else { Operand::k_major_swizzle_128b(tokens, 16 * kk) }
}

/// A tokens-schedule producer's loads of one gate/up unit: `count` stages of the 8 row tiles
/// `row_tile ..` of the tiled gate and up weights and of the tokens' columns of `x` (`maps`:
/// `x`, gate, up), from `state` on; returns the state after them.
///
/// # Safety
/// The pipeline's stages lie at `stages`, [`GATE_UP_TOKENS_STAGE_BYTES`] each, 1024-aligned;
/// the row tiles and the `count` stages' K-steps lie inside the maps' tensors.
#[inline(always)]
unsafe fn load_gate_up_unit<const S: usize>(pipeline: &Pipeline<S>, mut state: PipelineState<S>, stages: u32, [x_map, gate_map, up_map]: [TensorMap; 3], row_tile: usize, count: usize) -> PipelineState<S> {
    const STEPS: usize = GATE_UP_STAGE_STEPS;
    for k in 0..count {
        let full = pipeline.producer_acquire(state, GATE_UP_TOKENS_STAGE_BYTES);
        let stage = stages + state.stage() as u32 * GATE_UP_TOKENS_STAGE_BYTES;
        // SAFETY: the stage is free (its empty barrier passed) and the full barrier expects
        // all 3 boxes' bytes; the rest is the caller's.
        unsafe {
            load_weights(gate_map, stage, row_tile, k, STEPS, full);
            load_weights(up_map, stage + weight_box_bytes(STEPS), row_tile, k, STEPS, full);
            x_map.load_2d(stage + 2 * weight_box_bytes(STEPS), (k * STEPS * STEP) as i32, 0, full);
        }
        state = state.next();
    }
    state
}

/// The accumulators of a tokens-schedule consumer's `wgmma`s, whose B operand is the tokens'
/// rows: 64 of them ([`AccM64N64`], the tokens schedule's, up to 64 tokens) or 8
/// ([`AccM64N8`], the fused schedule's, up to 8 tokens: an eighth of the tensor cores' work
/// and of the registers). Register `i` of a thread lies where [`AccM64N256::position`] says.
trait TokenAcc {
    const ZERO: Self;
    /// Registers a thread holds.
    const REGS: usize;
    /// Register `i` (< `REGS`).
    fn value(&self, i: usize) -> f32;
    /// `self = A·Bᵀ + (accumulate ? self : 0)` for B the first token rows at `b`.
    ///
    /// # Safety
    /// As [`Warpgroup::mma_m64n64k16`], for as many B rows as `Self` has columns.
    unsafe fn mma(&mut self, wg: &Warpgroup, a: Operand<bf16>, b: Operand<bf16>, accumulate: bool);
}

/// [`TokenAcc`] for each accumulator type and the [`Warpgroup`] method that multiplies into it.
macro_rules! token_acc {
    ($($acc:ident => $mma:ident;)*) => {$(
        impl TokenAcc for $acc {
            const ZERO: Self = $acc::ZERO;
            const REGS: usize = $acc::ZERO.values.len();
            #[inline(always)]
            fn value(&self, i: usize) -> f32 {
                self.values[i]
            }
            #[inline(always)]
            unsafe fn mma(&mut self, wg: &Warpgroup, a: Operand<bf16>, b: Operand<bf16>, accumulate: bool) {
                // SAFETY: the caller's.
                unsafe { wg.$mma(a, b, self, accumulate) }
            }
        }
    )*};
}

token_acc! {
    AccM64N64 => mma_m64n64k16;
    AccM64N8 => mma_m64n8k16;
}

/// A tokens-schedule consumer warpgroup's product of one gate/up unit ([`load_gate_up_unit`]'s
/// `count` stages from `state` on), the last stage released: `[gate, up] × [even rows, odd
/// rows]` accumulators, and the state after the unit.
#[inline(always)]
fn multiply_gate_up_unit<A: TokenAcc, const S: usize>(wg: &Warpgroup, pipeline: &Pipeline<S>, state: PipelineState<S>, stages: u32, count: usize) -> ([A; 4], PipelineState<S>) {
    const STEPS: usize = GATE_UP_STAGE_STEPS;
    let mut acc = [A::ZERO, A::ZERO, A::ZERO, A::ZERO];
    let (last, next) = consume::<S, { 2 * STEPS as u32 }>(wg, pipeline, state, count, |s, kk, accumulate| {
        let stage = stages + s * GATE_UP_TOKENS_STAGE_BYTES;
        let b = tokens_operand(stage + 2 * weight_box_bytes(STEPS), kk, STEPS);
        unroll!(i in [0 1 2 3] {
            let a = weight_operand(stage + (i / 2) as u32 * weight_box_bytes(STEPS), (i % 2) as u32, kk, STEPS);
            // SAFETY: `consume`'s guarantees: the stage is loaded and stays so, the whole
            // warpgroup runs this after a fence; the first wgmma overwrites `acc`.
            unsafe { acc[i].mma(wg, a, b, accumulate) };
        });
    });
    if wg.thread_rank() == 0 {
        pipeline.consumer_release(last);
    }
    (acc, next)
}

/// Each `h = g · silu(gate) · up` of a gate/up unit ([`multiply_gate_up_unit`]'s `acc`) that
/// consumer thread `t` holds: `emit(c, f, value)` for token column `c < tokens` and the
/// unit's feature `f` (of 128), `g = gate(c)` (zero where the token did not choose the
/// expert). The thread's columns are `8j + 2 (t % 4) + dc` (register `4j + 2dv + dc`, rows
/// `m` and `m + 8` for `dv` 0 and 1), taken column by column, so that only one column's gate
/// weight and row of `h` are live at a time beside the accumulators (sixteen at once spilled,
/// and each store then waited on a reload; so did a second way to a gate weight, scanning the
/// block's own routing). Unrolled, so that `acc` is only indexed by constants.
#[inline(always)]
fn for_each_h<A: TokenAcc>(acc: &[A; 4], t: u32, tokens: usize, gate: impl Fn(usize) -> f32, mut emit: impl FnMut(usize, usize, f32)) {
    unroll!(j in [0 1 2 3 4 5 6 7] {
        unroll!(dc in [0 1] {
            let c = 8 * j + 2 * (t as usize % 4) + dc;
            if 4 * j < A::REGS && c < tokens {
                let g = gate(c);
                unroll!(dv in [0 1] {
                    let i = 4 * j + 2 * dv + dc;
                    let m = AccM64N256::position(t, i).0;
                    unroll!(parity in [0 1] {
                        emit(c, weight_row(m, parity), g * silu_gate(acc[parity].value(i), acc[2 + parity].value(i)));
                    });
                });
            }
        });
    });
}

/// The gate/up kernel on the *tokens schedule* (for many tokens): routing as
/// [`gate_up`], then every token against each selected expert's weights on `wgmma`, so that
/// an expert's rows are read once however many tokens chose it. Cluster 0's first block
/// publishes every token's gate weight for each expert in `gate_table` (zero where a token
/// did not choose the expert; [`table_index`]: tiles of [`ROUTER_TOKENS`] tokens), which
/// every block's epilogue reads. With `dense` (the *dense* schedule, for so many tokens that
/// every expert is chosen) the blocks take every expert's weights instead: then none needs
/// the routing to stream, so cluster `i` routes tokens `8i .. 8i + 8` alone (and publishes
/// their tile and choices) while the other clusters stream, their consumers waiting for the
/// table only at their first unit's end. A block (one an SM,
/// persistent) takes *units* of 128 features of one selected expert in turn; warpgroup 0's
/// first thread loads each K-step's gate and up tiles (a box each) and the tokens' 32
/// columns of `x` through TMA into a [`GATE_UP_TOKENS_STAGES`]-stage [`Pipeline`], warpgroup 1 multiplies
/// them (four `m64n64k16` accumulators: gate and up, even and odd rows) and writes
/// `h[t, e·ffn + f] = g[t, e] · silu(gate) · up` for every token — zero where `t` did not choose
/// `e` — so that the down projection is one GEMM over the selected experts' columns.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn gate_up_tokens(
    x: &[bf16],
    x_map: &[u64],
    router: &[bf16],
    w_gate: &[bf16],
    gate_map: &[u64],
    w_up: &[bf16],
    up_map: &[u64],
    h: &Out<bf16>,
    routing: &Out<u32>,
    pair_gate: &Out<f32>,
    top_ids: &Out<u32>,
    top_gates: &Out<f32>,
    k: usize,
    renormalize: bool,
    dense: bool,
    gate_table: &Published<f32>,
    timeline: &Out<u64>,
) {
    // On the tokens schedule the kernel is launched programmatically after the previous
    // step's down kernel, and has already waited for it: `gate_table`'s binding does
    // (`Published` reads its generation after `grid::wait_for_prerequisites`).
    stamp(timeline, 0);
    grid::launch_dependents();
    let tokens = top_ids.len() / k;
    let hidden = x.len() / tokens;
    let experts = router.len() / hidden;
    let ffn = h.len() / (tokens * experts);
    let (cluster_index, clusters) = (cluster::index_in_grid().x as usize, (grid::dim().x / cluster::size()) as usize);
    let groups = tokens.div_ceil(ROUTER_TOKENS);
    if tokens > MAX_TOKENS
        || !hidden.is_multiple_of(STEP * GATE_UP_UNROLL)
        || !ffn.is_multiple_of(TILE_ROWS)
        || w_gate.len() != experts * ffn * hidden
        || w_up.len() != w_gate.len()
        || gate_table.len() != MAX_TOKENS * experts
        || gate_table.tile_len() != ROUTER_TOKENS * experts
        || (dense && groups > clusters)
    {
        arch::trap();
    }
    let (x_map, gate_map, up_map) = (TensorMap::new(x_map), TensorMap::new(gate_map), TensorMap::new(up_map));
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let stages = smem.take::<u32>(GATE_UP_TOKENS_STAGES * GATE_UP_TOKENS_STAGE_BYTES as usize / 4).addr();
    // SAFETY: fresh shared memory; the routing's block barriers, or the one below where a
    // block does not route, come before the pipeline's first use.
    let pipeline = unsafe { Pipeline::<GATE_UP_TOKENS_STAGES>::new(smem.take::<u64>(2 * GATE_UP_TOKENS_STAGES), 1) };
    // The tokens this block's cluster routes: every one (tokens schedule), or dense, group
    // `i` of `ROUTER_TOKENS` in cluster `i`, while the other clusters stream at once.
    let own = if dense { cluster_index * ROUTER_TOKENS..((cluster_index + 1) * ROUTER_TOKENS).min(tokens) } else { 0..tokens };
    let routes = !own.is_empty();
    // The routing's block barriers order the pipeline's initialisation before its use, this
    // one where there is none.
    let dispatch = if routes {
        let (dispatch, ids, gates) = route_tokens(&mut smem, &x[own.start * hidden..own.end * hidden], router, own.len(), k, renormalize, timeline);
        if !dense {
            dispatch.hand_over(ids, gates, routing, pair_gate, top_ids, top_gates);
        }
        // The gate weights for every block (cluster 0's alone on the tokens schedule, whose
        // clusters all routed the same), and dense, the tokens' choices for the host.
        if cluster::block_rank() == 0 && (dense || cluster_index == 0) {
            for i in block::stride_loop(0..own.len() * experts) {
                let (t, e) = (i / experts, i % experts);
                gate_table.set(table_index(own.start + t, e, experts), chosen_gate(ids, gates, k, t, e));
            }
            if dense {
                for p in block::stride_loop(0..own.len() * k) {
                    top_ids.set(own.start * k + p, ids.load(p));
                    top_gates.set(own.start * k + p, gates.load(p));
                }
            }
            gate_table.publish(gate_table.tiles_of(own.start * experts..own.end * experts));
        }
        (!dense).then_some(dispatch)
    } else {
        block::sync();
        None
    };

    // An item is an expert's pairs (groups of 64 hold them all), a unit 128 of its
    // features; units go round robin, dense ones over every expert from the block after
    // the routing clusters on (so that their blocks take the fewest).
    const STEPS: usize = GATE_UP_STAGE_STEPS;
    let (tiles, stages_per_unit) = (ffn / TILE_ROWS, hidden / (STEP * STEPS));
    let (units, first) = match dispatch {
        Some(dispatch) => (dispatch.items() * tiles, 0),
        None => (experts * tiles, groups as u32 * cluster::size()),
    };
    let expert_of = |unit: usize| match dispatch {
        Some(dispatch) => dispatch.item(unit / tiles, MAX_TOKENS).expert,
        None => unit / tiles,
    };
    let units = || grid::round_robin(units as u32, first).map(|unit| unit as usize);
    let wg = Warpgroup::current();
    if wg.index() == 0 {
        if wg.thread_rank() == 0 {
            let mut state = PipelineState::START;
            for unit in units() {
                let row_tile = (expert_of(unit) * tiles + unit % tiles) * TILE_ROW_TILES;
                // SAFETY: the stages (1024-aligned) are the pipeline's; the row tiles are the
                // expert's (checked lengths) and the unit's K-steps inside them.
                state = unsafe { load_gate_up_unit(&pipeline, state, stages, [x_map, gate_map, up_map], row_tile, stages_per_unit) };
            }
        }
        return;
    }
    let t = wg.thread_rank();
    // The consumer's first thread stamps the routing and the end, so that a block's stamps
    // keep one thread's order where it has no unit (thread 0, the producer, would race it).
    if t == 0 && routes {
        crate::stamp(timeline, TIMELINE_POINTS, 2);
    }
    let mut state = PipelineState::START;
    let mut table = None;
    for unit in units() {
        let expert = expert_of(unit);
        let (acc, next) = multiply_gate_up_unit::<AccM64N64, _>(&wg, &pipeline, state, stages, stages_per_unit);
        state = next;
        // The gate weights, published by the routing clusters (at once on the tokens
        // schedule, whose every cluster routed the same; on the dense one, the first unit's
        // end is where a block waits for the routing): waited for once (a wait a unit, two
        // 16-byte polls at 64 tokens, slowed the 64-token steps by 5-7%).
        let table = table.get_or_insert_with(|| {
            let ready = gate_table.wait_alone(0..groups * ROUTER_TOKENS * experts);
            if t == 0 && !routes {
                crate::stamp(timeline, TIMELINE_POINTS, 2);
            }
            ready
        });
        let feature = expert * ffn + unit % tiles * TILE_ROWS;
        for_each_h(&acc, t, tokens, |c| table.get(table_index(c, expert, experts)), |c, f, value| {
            h.set(c * experts * ffn + feature + f, bf16::from_f32(value));
        });
    }
    // The block's end: its consumer's (the producer has returned).
    if t == 0 {
        crate::stamp(timeline, TIMELINE_POINTS, 3);
    }
}

/// Where the gate table holds token `t`'s gate weight for `expert`: tiles of
/// [`ROUTER_TOKENS`] tokens (a dense routing cluster's), each expert-major, so that an
/// epilogue's columns of one expert are a constant apart.
#[inline(always)]
fn table_index(t: usize, expert: usize, experts: usize) -> usize {
    (t / ROUTER_TOKENS * experts + expert) * ROUTER_TOKENS + t % ROUTER_TOKENS
}

/// Token `t`'s gate weight for `expert` in the routing's `ids`/`gates` (`tokens × k`), zero
/// where it did not choose it.
#[inline(always)]
fn chosen_gate(ids: SharedSlice<u32>, gates: SharedSlice<f32>, k: usize, t: usize, expert: usize) -> f32 {
    let mut g = 0.0;
    for slot in t * k..(t + 1) * k {
        if ids.load(slot) as usize == expert {
            g = gates.load(slot);
        }
    }
    g
}

/// The down kernel on the tokens schedule: `y = Σ_e W_down[e] · h[:, e]` over the selected
/// experts (`h` already holds each token's gate weight, zero for an expert it did not
/// choose), one GEMM over their concatenated columns. A cluster per 128 output rows splits
/// those columns' K-steps into contiguous ranges, one a block: warpgroup 0's first thread
/// loads each 2 K-steps' weight tiles (a box) and the tokens' 64 columns of `h` through TMA into a
/// [`DOWN_TOKENS_STAGES`]-stage [`Pipeline`], warpgroup 1 multiplies them (two `m64n64k16`
/// accumulators: even and odd rows), and `cluster::reduce_scatter` sums the blocks' tiles in rank order into
/// `y` (no atomics: bitwise deterministic).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn down_tokens(h: &Out<bf16>, h_map: &[u64], routing: &Out<u32>, pair_gate: &Out<f32>, w_down: &[bf16], down_map: &[u64], out: &Out<bf16>, k: usize, dense: bool, timeline: &Out<u64>) {
    stamp(timeline, 0);
    let tokens = pair_gate.len() / k;
    let hidden = out.len() / tokens;
    let experts = routing.len() - tokens * k;
    let ffn = h.len() / (tokens * experts);
    if tokens > MAX_TOKENS || !ffn.is_multiple_of(STEP) || !hidden.is_multiple_of(TILE_ROWS) || w_down.len() != experts * hidden * ffn {
        arch::trap();
    }
    let (h_map, down_map) = (TensorMap::new(h_map), TensorMap::new(down_map));
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let stages = smem.take::<u32>(DOWN_TOKENS_STAGES * DOWN_TOKENS_STAGE_BYTES as usize / 4).addr();
    // SAFETY: fresh shared memory; the block barriers of the wait below come before its use.
    let pipeline = unsafe { Pipeline::<DOWN_TOKENS_STAGES>::new(smem.take::<u64>(2 * DOWN_TOKENS_STAGES), 1) };
    // The block's tile of `y` before the cluster's sum: 128 rows × the tokens (not the 64
    // columns the `wgmma` computes: the sum's DSMEM reads scale with the tile).
    let tile = smem.take::<f32>(TILE_ROWS * tokens);
    let dispatch = Dispatch::take(&mut smem, experts, tokens * k);
    // Waits for the gate/up kernel; its block barriers order the pipeline's initialisation.
    // Dense: every expert, no routing to receive.
    let dispatch = if dense {
        grid::wait_for_prerequisites();
        block::sync();
        None
    } else {
        dispatch.receive(routing, pair_gate, MAX_TOKENS);
        Some(dispatch)
    };
    // The gate/up kernel it waited for has completed: the tokens schedule's next may start.
    grid::launch_dependents();
    stamp(timeline, 2);

    const STEPS: usize = DOWN_STAGE_STEPS;
    let steps = ffn / (STEP * STEPS);
    let (rank, size) = (cluster::block_rank() as usize, cluster::size() as usize);
    let units = dispatch.map_or(experts, |dispatch| dispatch.items()) * steps;
    let (lo, hi) = (rank * units / size, (rank + 1) * units / size);
    // A block with no K-steps (more blocks than steps) multiplies one step of zeros (`h`'s
    // columns past its last, which TMA fills with zeros) rather than skip the main loop: a
    // path around it would set the accumulators outside `wgmma`, which serialises them all.
    let count = (hi - lo).max(1);
    let row_tiles = cluster::index_in_grid().x as usize * TILE_ROW_TILES;
    let wg = Warpgroup::current();
    if wg.index() == 0 {
        if wg.thread_rank() == 0 {
            let mut state = PipelineState::START;
            // The unit's item and K-step, advanced without a division a stage (a lone thread
            // issues every stage: its instructions pace the stream).
            let (mut item, mut step) = (lo / steps, lo % steps);
            for unit in lo..lo + count {
                let expert = match dispatch {
                    _ if unit >= hi => experts,
                    Some(dispatch) => dispatch.item(item, MAX_TOKENS).expert,
                    None => item,
                };
                let s = if unit < hi { step } else { 0 };
                (item, step) = if step + 1 == steps { (item + 1, 0) } else { (item, step + 1) };
                let full = pipeline.producer_acquire(state, DOWN_TOKENS_STAGE_BYTES);
                let stage = stages + state.stage() as u32 * DOWN_TOKENS_STAGE_BYTES;
                // SAFETY: the stage's 24 KB (1024-aligned) are free and the full barrier
                // expects both boxes' bytes; the row tiles are the expert's (checked lengths)
                // and `s < steps`.
                unsafe {
                    load_weights(down_map, stage, expert.min(experts - 1) * hidden / ROWS + row_tiles, s, STEPS, full);
                    h_map.load_2d(stage + weight_box_bytes(STEPS), (expert * ffn + s * STEPS * STEP) as i32, 0, full);
                }
                state = state.next();
            }
        }
    } else {
        let mut acc = [AccM64N64::ZERO, AccM64N64::ZERO];
        consume::<DOWN_TOKENS_STAGES, { 2 * STEPS as u32 }>(&wg, &pipeline, PipelineState::START, count, |s, kk, accumulate| {
            let stage = stages + s * DOWN_TOKENS_STAGE_BYTES;
            let b = tokens_operand(stage + weight_box_bytes(STEPS), kk, STEPS);
            for (parity, acc) in acc.iter_mut().enumerate() {
                // SAFETY: as in `gate_up_tokens`.
                unsafe { wg.mma_m64n64k16(weight_operand(stage, parity as u32, kk, STEPS), b, acc, accumulate) };
            }
        });
        let t = wg.thread_rank();
        unroll!(parity in [0 1] {
            unroll!(i in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31] {
                let (m, c) = AccM64N256::position(t, i);
                if c < tokens {
                    tile.store(weight_row(m, parity) * tokens + c, acc[parity].values[i]);
                }
            });
        });
    }
    cluster::reduce_scatter(tile, Sum, |i, value| {
        let (r, t) = (i / tokens, i % tokens);
        out.set(t * hidden + row_tiles * ROWS + r, bf16::from_f32(value));
    });
    stamp(timeline, 3);
}

/// Most tokens the fused schedule takes: a block's partial `y` (`tokens × hidden` f32) sits
/// in its shared memory beside the gate/up pipeline, and its `wgmma`s take 8 token rows
/// (`m64n8k16`).
pub const FUSED_MAX_TOKENS: usize = 8;
/// The fused kernel's `h` tile: 8 token rows (every token, zeros past the last) × a unit's
/// 128 features, bf16, as two boxes of 64 features (128-byte rows) under the 128-byte
/// swizzle — the down projection's B operand, as `tokens_operand` reads the first 8 rows of
/// a stage's `h`.
const FUSED_H_BOX_BYTES: u32 = (FUSED_MAX_TOKENS * 2 * STEP * DOWN_STAGE_STEPS) as u32;
/// Down stages of a unit's 128 features for one 128-row group of the output.
const FUSED_DOWN_STAGES: usize = TILE_ROWS / (STEP * DOWN_STAGE_STEPS);

/// Bytes of gate and up weights that [`prefetch_likely_units`] asks L2 for a step, over all
/// clusters: about what the HBM moves in the 4-5 µs from a one-token routing's logits to the
/// stream's first bytes (8 MiB gained less at one DeepSeek token: results/moe-h200.md,
/// session 51).
const PREFETCH_BYTES: usize = 16 << 20;

/// While a one-token routing is exchanged (every thread calls it, `logits` its block's
/// experts'), asks L2 for the first bytes of the gate and up rows of the units the step will
/// likely stream: those of the experts of this block's `2k / cluster` largest logits (twice
/// the block's share of the token's `k`), their (expert, tile, matrix) entries shared out over
/// the clusters and then over warps 1.. of a block, one contiguous prefetch an entry (the
/// start of the unit's first row tile; [`PREFETCH_BYTES`] over all). The HBM is idle until
/// the routing is ready; what it fetches meanwhile for experts the token then chooses is
/// read from L2. Warp 0, which ranks the exchanged logits next, issues none: a prefetch
/// holds its warp until L2 takes it (warp 0 issuing a block's 32 small ones held the routing
/// back 4.3 µs). Blocks of more than 32 experts (a lane each) ask for none.
#[inline(always)]
fn prefetch_likely_units(logits: SharedSlice<f32>, k: usize, weights: [&[bf16]; 2], tiles: usize, steps: usize) {
    let (local, size, warp, lane) = (logits.len(), cluster::size() as usize, warp::index_in_block() as usize, warp::lane() as usize);
    if warp == 0 || local > 32 {
        return;
    }
    let picks = (2 * k).div_ceil(size).min(local);
    let (entries, tile_len) = (picks * tiles * 2, STEP * ROWS);
    let row_tile = steps * tile_len;
    // Elements an entry: the budget's share over every block's entries, in whole tiles.
    let chunk = (PREFETCH_BYTES / 2 / (size * entries) / tile_len * tile_len).min(row_tile);
    let (clusters, cluster) = (grid::dim().x as usize / size, cluster::index_in_grid().x as usize);
    // This lane's expert's place among the block's `picks` largest logits, if among them.
    let mut place = usize::MAX;
    warp_top_k(local, picks, |i| rank_key(logits.load(i), i as u32), |p, _| place = p);
    // Entry `g` (pick `g / 2 tiles`, tile `g / 2 % tiles`, matrix `g % 2`) goes to cluster
    // `g % clusters`, warp `1 + g / clusters % (WARPS - 1)` of its block.
    for g in (cluster + clusters * (warp - 1)..entries).step_by(clusters * (WARPS - 1)) {
        let (pick, tile, matrix) = (g / (2 * tiles), g / 2 % tiles, g % 2);
        let holder = warp::ballot(place == pick).trailing_zeros() as usize;
        if lane == 0 && holder < local {
            let expert = cluster::block_rank() as usize * local + holder;
            let at = (expert * tiles + tile) * TILE_ROW_TILES * row_tile;
            global::prefetch_l2(&weights[matrix][at..at + chunk]);
        }
    }
}

/// The *fused schedule*, one launch (for few tokens): the tokens schedule's routing and
/// gate/up units, each unit then multiplying its own 128 features of `h` by the same 128
/// columns of its expert's `W_down` — the down projection split along the FFN features, so
/// no block waits for another's `h` and no second launch streams the down weights after the
/// first has drained. A block (one an SM, persistent) takes units of 128 features of a
/// selected expert round robin: warpgroup 0's first thread loads the unit's gate and up
/// stages (as [`gate_up_tokens`]), then its `W_down` columns, 128 output rows × 2 K-steps a
/// stage, through the same [`Pipeline`]; warpgroup 1 multiplies the gate and up stages,
/// writes `h = g · silu(gate) · up` (bf16, each token's gate weight from the block's own
/// routing) into a swizzled shared tile, and multiplies each down stage with it, adding each
/// 128-row group's product to the block's partial `y` in shared memory. At the end every
/// block publishes its partial ([`Published`]), waits for all of them, and its warps sum
/// each output over the blocks in block order: no atomics, bitwise deterministic.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn fused_tokens(
    x: &[bf16],
    x_map: &[u64],
    router: &[bf16],
    weights: [(&[bf16], &[u64]); 3],
    out: &Out<bf16>,
    top_ids: &Out<u32>,
    top_gates: &Out<f32>,
    k: usize,
    renormalize: bool,
    partials: &Published<f32>,
    timeline: &Out<u64>,
) {
    stamp(timeline, 0);
    let [(w_gate, gate_map), (w_up, up_map), (w_down, down_map)] = weights;
    let tokens = top_ids.len() / k;
    let hidden = x.len() / tokens;
    let experts = router.len() / hidden;
    let ffn = w_gate.len() / (experts * hidden);
    let (blocks, block) = (grid::dim().x as usize, block::index_x() as usize);
    let partial = tokens * hidden;
    if tokens > FUSED_MAX_TOKENS
        || !hidden.is_multiple_of(TILE_ROWS)
        || !hidden.is_multiple_of(STEP * GATE_UP_UNROLL)
        || !ffn.is_multiple_of(TILE_ROWS)
        || w_gate.len() != experts * ffn * hidden
        || w_up.len() != w_gate.len()
        || w_down.len() != w_gate.len()
        || out.len() != partial
        || partials.tile_len() != partial
        || partials.len() < blocks * partial
    {
        arch::trap();
    }
    let (x_map, gate_map, up_map, down_map) = (TensorMap::new(x_map), TensorMap::new(gate_map), TensorMap::new(up_map), TensorMap::new(down_map));
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let stages = smem.take::<u32>(GATE_UP_TOKENS_STAGES * GATE_UP_TOKENS_STAGE_BYTES as usize / 4).addr();
    // 1024-aligned: the stages are whole KB.
    let h_tile = smem.take::<bf16>(2 * FUSED_H_BOX_BYTES as usize / 2);
    // SAFETY: fresh shared memory; the routing's block barriers come before its use.
    let pipeline = unsafe { Pipeline::<GATE_UP_TOKENS_STAGES>::new(smem.take::<u64>(2 * GATE_UP_TOKENS_STAGES), 1) };
    let sums = smem.take::<f32>(partial);
    // The tile's rows past the last token stay zero; the sums start at zero (the routing's
    // block barriers order these stores before every use).
    for i in block::stride_loop(0..h_tile.len()) {
        h_tile.store(i, bf16::from_bits(0));
    }
    for i in block::stride_loop(0..partial) {
        sums.store(i, 0.0);
    }
    const STEPS: usize = GATE_UP_STAGE_STEPS;
    let (tiles, stages_per_unit, groups) = (ffn / TILE_ROWS, hidden / (STEP * STEPS), hidden / TILE_ROWS);
    let (dispatch, ids, gates) = route_fused(&mut smem, x, router, tokens, k, renormalize, timeline, [w_gate, w_up], tiles, hidden / STEP);
    if cluster::index_in_grid().x == 0 && cluster::block_rank() == 0 {
        for p in block::stride_loop(0..tokens * k) {
            top_ids.set(p, ids.load(p));
            top_gates.set(p, gates.load(p));
        }
    }
    stamp(timeline, 2);

    let expert_of = |unit: usize| dispatch.item(unit / tiles, MAX_TOKENS).expert;
    let units = || grid::round_robin((dispatch.items() * tiles) as u32, 0).map(|unit| unit as usize);
    let wg = Warpgroup::current();
    if wg.index() == 0 {
        if wg.thread_rank() == 0 {
            let mut state = PipelineState::START;
            for unit in units() {
                let (expert, tile) = (expert_of(unit), unit % tiles);
                let row_tile = (expert * tiles + tile) * TILE_ROW_TILES;
                // SAFETY: as in `gate_up_tokens`.
                state = unsafe { load_gate_up_unit(&pipeline, state, stages, [x_map, gate_map, up_map], row_tile, stages_per_unit) };
                // The unit's 128 columns of `W_down`, 128 output rows at a time.
                for group in 0..groups {
                    for j in 0..FUSED_DOWN_STAGES {
                        let full = pipeline.producer_acquire(state, weight_box_bytes(DOWN_STAGE_STEPS));
                        let stage = stages + state.stage() as u32 * GATE_UP_TOKENS_STAGE_BYTES;
                        // SAFETY: the stage (1024-aligned, 20 KB) is free and the full barrier
                        // expects the box's 16 KB; the row tiles are the expert's output rows
                        // (checked lengths), the K-steps the unit's features.
                        unsafe { load_weights(down_map, stage, expert * hidden / ROWS + group * TILE_ROW_TILES, tile * FUSED_DOWN_STAGES + j, DOWN_STAGE_STEPS, full) };
                        state = state.next();
                    }
                }
            }
        }
    } else {
        let t = wg.thread_rank();
        let mut state = PipelineState::START;
        for unit in units() {
            let expert = expert_of(unit);
            let (acc, next) = multiply_gate_up_unit::<AccM64N8, _>(&wg, &pipeline, state, stages, stages_per_unit);
            state = next;
            // The previous unit's down `wgmma`s have read the tile (each thread waited for
            // its own): now every thread has.
            wg.sync();
            // `h` of token column `c` and feature `f` of the unit at row `c`, column `f` of the
            // tile (box `f / 64`).
            for_each_h(&acc, t, tokens, |c| chosen_gate(ids, gates, k, c, expert), |c, f, value| {
                let byte = (f / 64) as u32 * FUSED_H_BOX_BYTES + swizzle_128b((c * 128 + f % 64 * 2) as u32);
                h_tile.store(byte as usize / 2, bf16::from_f32(value));
            });
            // The tile, written through the generic proxy, is read by `wgmma` (the async
            // proxy) once the whole warpgroup has written its part.
            arch::fence_proxy_async_shared_cta();
            wg.sync();
            let tile_at = h_tile.addr();
            // The unit's down stages, group after group, the `wgmma`s never drained between
            // groups: groups alternate between two sets of accumulators, and a group's sums
            // are added once the next group's first stage is issued (`wait::<1>` then covers
            // every earlier stage).
            let (mut even, mut odd) = ([AccM64N8::ZERO, AccM64N8::ZERO], [AccM64N8::ZERO, AccM64N8::ZERO]);
            let mut previous: Option<PipelineState<GATE_UP_TOKENS_STAGES>> = None;
            // Each value this thread holds is its own cell of the partial `y`.
            let add_group = |down: &[AccM64N8; 2], group: usize| {
                unroll!(parity in [0 1] {
                    unroll!(i in [0 1 2 3] {
                        let (m, c) = AccM64N256::position(t, i);
                        if c < tokens {
                            let cell = c * hidden + group * TILE_ROWS + weight_row(m, parity);
                            sums.store(cell, sums.load(cell) + down[parity].values[i]);
                        }
                    });
                });
            };
            for pair in (0..groups).step_by(2) {
                unroll!(half in [0 1] {
                    let group = pair + half;
                    let (down, done) = if half == 0 { (&mut even, &odd) } else { (&mut odd, &even) };
                    // An odd count of groups (hidden 128, 384, ...) ends on an even one.
                    for j in 0..if group < groups { FUSED_DOWN_STAGES } else { 0 } {
                        pipeline.consumer_wait(state);
                        wg.fence();
                        let stage = stages + state.stage() as u32 * GATE_UP_TOKENS_STAGE_BYTES;
                        for kk in 0..2 * DOWN_STAGE_STEPS as u32 {
                            // Stage `j` of the group multiplies box `j` of the tile.
                            let b = tokens_operand(tile_at + j as u32 * FUSED_H_BOX_BYTES, kk, DOWN_STAGE_STEPS);
                            unroll!(parity in [0 1] {
                                // SAFETY: the stage is loaded (its full barrier passed) and stays
                                // so until released below, after a later wait; the tile was
                                // written before the fence and barrier above and stays unwritten
                                // until the next unit's barrier; the whole warpgroup runs this
                                // after a fence, and `down` is read only after a wait covers it.
                                unsafe { wg.mma_m64n8k16(weight_operand(stage, parity as u32, kk, DOWN_STAGE_STEPS), b, &mut down[parity], j > 0 || kk > 0) };
                            });
                        }
                        wg.commit();
                        wg.wait::<1>();
                        if let (Some(done), 0) = (previous, t) {
                            pipeline.consumer_release(done);
                        }
                        previous = Some(state);
                        state = state.next();
                        // The group before this one is complete.
                        if j == 0 && group > 0 {
                            add_group(done, group - 1);
                        }
                    }
                });
            }
            wg.wait::<0>();
            if let (Some(done), 0) = (previous, t) {
                pipeline.consumer_release(done);
            }
            add_group(if groups % 2 == 0 { &odd } else { &even }, groups - 1);
        }
    }
    // Both warpgroups: the block's partial `y` is whole (the consumer's sums).
    block::sync();
    for i in block::stride_loop(0..partial) {
        partials.set(block * partial + i, sums.load(i));
    }
    partials.publish(block..block + 1);
    let all = partials.wait(0..blocks * partial);
    // Warp `w` of block `b` sums outputs `b · 8 + w`, then every 8 · blocks-th (`count` of
    // them): its lanes the blocks' partials in block order, strided by 32, then the warp's sum
    // (a fixed tree). A lane loads 4 outputs' partials of its first 5 blocks before it adds
    // any: one L2 round trip where a loop that added each load waited for each (3 of them at
    // one DeepSeek token, 4.6 µs from the last block's down projection to the kernel's end).
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let (first, stride) = (block * WARPS + warp, blocks * WARPS);
    let count = partial.saturating_sub(first).div_ceil(stride);
    for c in (0..count).step_by(4) {
        let mut values = [[0.0f32; 5]; 4];
        unroll!(i in [0 1 2 3] {
            unroll!(s in [0 1 2 3 4] {
                let b = lane + 32 * s;
                if c + i < count && b < blocks {
                    values[i][s] = all.get(b * partial + first + (c + i) * stride);
                }
            });
        });
        unroll!(i in [0 1 2 3] {
            if c + i < count {
                let o = first + (c + i) * stride;
                let more = (lane + 32 * 5..blocks).step_by(32).map(|b| all.get(b * partial + o));
                let sum = warp::reduce_sum(values[i].into_iter().chain(more).sum::<f32>());
                if lane == 0 {
                    out.set(o, bf16::from_f32(sum));
                }
            }
        });
    }
    stamp(timeline, 3);
}

macro_rules! moe_kernels {
    (gate_up: [$($gate_up:ident, $g_nt:literal, $g_pairs:literal;)*] down: [$($down:ident, $d_nt:literal, $d_pairs:literal;)*]) => {
        $(
            /// MoE launch 1/2 (routing, gate and up projections) for experts serving up to
            #[doc = concat!($g_pairs, " pairs per pass over their weights (more take another pass).")]
            /// `top_ids`/`top_gates` (`tokens × top_k`) receive the routing; `h` (`tokens · top_k ×
            /// ffn`) the pairs' activations, `routing` (`experts + tokens · top_k`: each
            /// expert's pair count, then the pairs' tokens) and `pair_gate` what the down kernel
            /// needs; `timeline` the blocks' [`TIMELINE_POINTS`].
            #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
            #[allow(clippy::too_many_arguments)]
            pub fn $gate_up(x: &[bf16], router: &[bf16], w_gate: &[bf16], w_up: &[bf16], h: Out<bf16>, routing: Out<u32>, pair_gate: Out<f32>, top_ids: Out<u32>, top_gates: Out<f32>, top_k: u32, renormalize: u32, timeline: Out<u64>) {
                gate_up::<$g_nt>(x, router, w_gate, w_up, &h, &routing, &pair_gate, &top_ids, &top_gates, top_k as usize, renormalize != 0, &timeline)
            }
        )*
        $(
            /// MoE launch 2/2 (down projection and combine) for experts serving up to
            #[doc = concat!($d_pairs, " pairs per pass; `out` is `tokens × hidden`, `timeline` the blocks' [`TIMELINE_POINTS`].")]
            #[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
            pub fn $down(h: Out<bf16>, routing: Out<u32>, pair_gate: Out<f32>, w_down: &[bf16], out: Out<bf16>, top_k: u32, timeline: Out<u64>) {
                down::<$d_nt>(&h, &routing, &pair_gate, w_down, &out, top_k as usize, &timeline)
            }
        )*
    };
}

/// MoE launch 1/2 on the tokens schedule ([`fn@moe_gate_up_g8`]'s arguments, with the
/// tensor maps of `x` (boxes of 64 rows × 32 columns) and of the tiled gate and up weights
/// (a 16 × 32 tile a box; [`host::Buffers`] makes them)); `h` is `tokens × experts · ffn`.
/// `gate_table` ([`MAX_TOKENS`] `× experts`, in tiles of [`ROUTER_TOKENS`] tokens) carries the
/// gate weights from the routing clusters to every block; with `dense` nonzero, the dense
/// schedule: every expert's weights, the first `tokens / 8` clusters routing (`routing` and
/// `pair_gate` are then left alone: the dense down kernel needs neither).
#[kernel(persistent, launch_bounds(max_threads = 256, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn moe_gate_up_tokens(
    x: &[bf16],
    x_map: &[u64],
    router: &[bf16],
    w_gate: &[bf16],
    gate_map: &[u64],
    w_up: &[bf16],
    up_map: &[u64],
    h: Out<bf16>,
    routing: Out<u32>,
    pair_gate: Out<f32>,
    top_ids: Out<u32>,
    top_gates: Out<f32>,
    top_k: u32,
    renormalize: u32,
    dense: u32,
    gate_table: Published<f32>,
    timeline: Out<u64>,
) {
    gate_up_tokens(x, x_map, router, w_gate, gate_map, w_up, up_map, &h, &routing, &pair_gate, &top_ids, &top_gates, top_k as usize, renormalize != 0, dense != 0, &gate_table, &timeline)
}

/// MoE launch 2/2 on the tokens schedule ([`fn@moe_down_g8`]'s arguments, with the tensor maps
/// of `h` (boxes of 64 rows × 32 columns) and of the tiled down weights); with `dense`
/// nonzero, over every expert (the dense schedule: `routing` and `pair_gate` unread).
#[kernel(launch_bounds(max_threads = 256, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn moe_down_tokens(h: Out<bf16>, h_map: &[u64], routing: Out<u32>, pair_gate: Out<f32>, w_down: &[bf16], down_map: &[u64], out: Out<bf16>, top_k: u32, dense: u32, timeline: Out<u64>) {
    down_tokens(&h, h_map, &routing, &pair_gate, w_down, down_map, &out, top_k as usize, dense != 0, &timeline)
}

/// MoE in one launch: the fused schedule ([`fn@moe_gate_up_tokens`]'s arguments without the
/// hand-over, with the down weights and their tensor map, `out` (`tokens × hidden`) and
/// `partials` (a tile of `tokens × hidden` a block, at least as many tiles as blocks)).
#[kernel(persistent, launch_bounds(max_threads = 256, min_blocks = 1))]
#[allow(clippy::too_many_arguments)]
pub fn moe_fused(
    x: &[bf16],
    x_map: &[u64],
    router: &[bf16],
    w_gate: &[bf16],
    gate_map: &[u64],
    w_up: &[bf16],
    up_map: &[u64],
    w_down: &[bf16],
    down_map: &[u64],
    out: Out<bf16>,
    top_ids: Out<u32>,
    top_gates: Out<f32>,
    top_k: u32,
    renormalize: u32,
    partials: Published<f32>,
    timeline: Out<u64>,
) {
    fused_tokens(x, x_map, router, [(w_gate, gate_map), (w_up, up_map), (w_down, down_map)], &out, &top_ids, &top_gates, top_k as usize, renormalize != 0, &partials, &timeline)
}

// The down kernel has no 32-pair form: with 4 n-tiles too few of its steps' loads fit in
// flight (Mixtral's at 64 tokens took 809 µs against 414 with groups of 16).
moe_kernels! {
    gate_up: [moe_gate_up_g8, 1, 8; moe_gate_up_g16, 2, 16; moe_gate_up_g32, 4, 32;]
    down: [moe_down_g8, 1, 8; moe_down_g16, 2, 16;]
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
