//! A BERT-base encoder (post-LN, fp16) out of the library's kernels, two ways.
//! **Unfused**, one kernel per op as a framework launches them (16 per layer): the QKV
//! projection, its bias, attention scores (batched Q·Kᵀ / √64), [`crate::softmax`], the
//! context P·V, the output projection, its bias, the residual add, LayerNorm, the FFN's up
//! projection, bias, GELU, down projection, bias, residual add and LayerNorm — projections on
//! the tensor cores, element-wise ops and norms from [`crate::norms`]. **Fused**, the
//! chains the proximity advice finds (7 per layer): GEMMs with bias, bias + GELU and residual
//! epilogues, one attention kernel (FlashAttention-2 style on the tensor cores: scores,
//! online softmax and context of 16 queries per warp in registers), and bias + LayerNorm in
//! one kernel, each launched programmatically after the previous one (a GEMM's first weight
//! loads overlap the previous kernel's tail). Where no projection takes the `wgmma` GEMM
//! (BERT-base at batch 1-4 on the H200) the fused mode has 5 per layer and none of them a LayerNorm: all four projections take the split-K `wgmma` kernels, O and
//! FFN2 write each LayerNorm's input with its rows' statistics, and the kernels that read the
//! LayerNorm's output take it on the fly — QKV and FFN1 folded into their product, O and FFN2
//! of their residual — so that no kernel waits for another cluster's columns of a row
//! (`DeferredNorms`); attention splits each block's keys over its warps (`attention_split`,
//! 4× the blocks).
//!
//! Each projection runs on the `wgmma` GEMM ([`crate::wgmma_gemm`]) (weights as `out × in`, through tensor
//! maps) once its 128 × 256 tiles cover the GPU, below that on the split-K `mma.sync`
//! GEMM ([`crate::gemm`], weights as `in × out`) — but in the fused mode, O and FFN2 below that take the
//! split-K `wgmma` GEMM (128 × 64 tiles, K split over a cluster where the SMs allow),
//! writing the LayerNorm's input with its rows' statistics for `layer_norm_rows` (BERT-base
//! at batch 8 and 16), and where it defers its LayerNorms all four do: see
//! `Projections::pick`.
//!
//! Every attention kernel runs on the tensor cores, a block per 64 queries of a (batch
//! element, head), reading Q, K and V from the QKV projection's output and writing the
//! context merged back to `tokens × hidden`; the unfused scores and probabilities go through
//! global memory in f32, as `torch.bmm` → `softmax` → `torch.bmm` would. The two
//! modes differ in GELU: the unfused kernel uses erf (BERT's definition), the GEMM epilogue
//! the tanh form; each is checked against an f64 reference of its own.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use clusterfuse::{f16, host::Gpu};
//! use clusterfuse_kernels::bert::{Batch, Kernels, Mode, Model, BERT_BASE};
//!
//! let gpu = Gpu::new(0)?;
//! let model = Model::random(&gpu, BERT_BASE, 42)?; // 12 layers, random weights from seed 42
//! let x = vec![f16::from_f32(0.1); 4 * BERT_BASE.seq * BERT_BASE.hidden]; // batch 4
//! let mut batch = Batch::new(&gpu, &BERT_BASE, 4, &x)?; // picks each projection's GEMM
//! batch.forward(gpu.stream(), &Kernels::load(&gpu)?, &model, Mode::Fused)?;
//! let y = gpu.download(batch.x())?;
//! # let _ = y; Ok(()) }
//! ```

use crate::norms::{layernorm_gelu, store_row};
use clusterfuse::arch;
use clusterfuse::mma::{mma_m16n8k16, FragA, FragB, FragC};
use clusterfuse::prelude::*;
use clusterfuse::tma::{Pipeline, PipelineState, TensorMap};

/// Elements per head.
pub const HEAD_DIM: usize = 64;
/// The longest sequence.
pub const MAX_SEQ: usize = 128;
/// Warps per block of the attention kernels, each taking 16 queries (one `mma` tile of rows).
pub const ATTENTION_WARPS: u32 = 4;
/// Queries per block of the attention kernels.
pub const QUERIES_PER_BLOCK: usize = 16 * ATTENTION_WARPS as usize;
/// Row stride of the Q, K and V tiles staged by `cp.async` ([`Padded`]), in halves: a row of
/// 64 plus 16 bytes, so the eight rows an `ldmatrix` reads fall in distinct banks.
const TILE_STRIDE: usize = HEAD_DIM + 8;
/// Bytes of a row of a tile staged by TMA ([`Swizzled`]): one head's 64 halves.
const ROW_BYTES: usize = 2 * HEAD_DIM;
/// Tokens per box of the QKV output's tensor map (`qkv_map`): 16 rows of a tile, 2 KB.
pub const BOX_TOKENS: usize = 16;
/// The 16-dimension slices of a head, and its 8-dimension column tiles.
const SLICES: usize = HEAD_DIM / 16;
const COLUMN_TILES: usize = HEAD_DIM / 8;

// The attention kernels all run on the tensor cores with one launch shape: block (x, h, b)
// takes queries `64 x ..+ 64` of head `h` of batch element `b`, grid (⌈seq / 64⌉, heads,
// batch), 128 threads; `seq` a multiple of 16 up to `MAX_SEQ` (they trap otherwise). A block
// stages what it reads of the QKV projection's output (`tokens × 3·hidden`: Q, K, V side by
// side, head `h` at columns `64 h ..+ 64` of each) in shared memory — 16 bytes a thread at a
// time by `cp.async`, or, in `attention_split` (BERT's batch 1), by TMA: a box of 16 tokens
// an instruction, all issued by one thread and landing on one mbarrier, which took the pass
// 10 µs less (`results/bert-h200.md`) — and each warp then works on 16 queries and 16 keys at
// a time.

/// A staged tile of Q, K or V, as the `mma` fragments read it: each by one `ldmatrix`, the
/// whole warp together.
trait Layout: Copy {
    /// Rows `row ..+ 16`, columns `col ..+ 16`, as an A fragment.
    fn a(self, row: usize, col: usize) -> FragA<f16>;
    /// Rows (n) `n ..+ 8`, columns (k) `k ..+ 16`, as a B fragment (keys: `q·kᵀ`).
    fn b_n_major(self, n: usize, k: usize) -> FragB<f16>;
    /// Rows (k) `k ..+ 16`, columns (n) `n ..+ 8`, as a B fragment (values: `p·v`).
    fn b_k_major(self, k: usize, n: usize) -> FragB<f16>;
}

/// A tile staged by `cp.async` ([`AttentionBlock::stage`]): rows of [`TILE_STRIDE`] halves,
/// read by the checked loaders (they trap outside the tile).
#[derive(Clone, Copy)]
struct Padded(SharedSlice<f16>);

impl Layout for Padded {
    #[inline(always)]
    fn a(self, row: usize, col: usize) -> FragA<f16> {
        FragA::load(self.0, TILE_STRIDE, row, col)
    }
    #[inline(always)]
    fn b_n_major(self, n: usize, k: usize) -> FragB<f16> {
        FragB::load_n_major(self.0, TILE_STRIDE, n, k)
    }
    #[inline(always)]
    fn b_k_major(self, k: usize, n: usize) -> FragB<f16> {
        FragB::load_k_major(self.0, TILE_STRIDE, k, n)
    }
}

/// A tile staged by TMA ([`AttentionBlock::stage_boxes`]), 1024-aligned: rows of 128 bytes,
/// under the 128-byte swizzle 16-byte chunk `c` of row `r` at chunk `c ^ (r % 8)`, so that the
/// 8 rows an `ldmatrix` reads at one column fall in distinct banks.
#[derive(Clone, Copy)]
struct Swizzled(SharedSlice<f16>);

impl Swizzled {
    /// The shared address of columns `col ..+ 8` (`col` a multiple of 8) of row `row`.
    #[inline(always)]
    fn chunk(self, row: usize, col: usize) -> u32 {
        self.0.addr() + (row * ROW_BYTES + ((col / 8) ^ (row % 8)) * 16) as u32
    }
}

// Unchecked: `attention_split`, the only kernel with swizzled tiles, stages `MAX_SEQ` rows of
// keys and values and all its queries, and reads only those (`AttentionBlock::new` keeps `seq`
// to `MAX_SEQ`, the loops stay below it), after they have landed.
impl Layout for Swizzled {
    #[inline(always)]
    fn a(self, row: usize, col: usize) -> FragA<f16> {
        let lane = warp::lane() as usize;
        // SAFETY: this lane's 16 bytes of the fragment, in the landed tile (above).
        unsafe { FragA::load_at(self.chunk(row + lane % 16, col + lane / 16 * 8)) }
    }
    #[inline(always)]
    fn b_n_major(self, n: usize, k: usize) -> FragB<f16> {
        let lane = warp::lane() as usize;
        // SAFETY: as for `a`.
        unsafe { FragB::load_n_major_at(self.chunk(n + lane % 8, k + lane / 8 % 2 * 8)) }
    }
    #[inline(always)]
    fn b_k_major(self, k: usize, n: usize) -> FragB<f16> {
        let lane = warp::lane() as usize;
        // SAFETY: as for `a`.
        unsafe { FragB::load_k_major_at(self.chunk(k + lane % 16, n)) }
    }
}

/// Where this block of an attention kernel works.
struct AttentionBlock {
    seq: usize,
    heads: usize,
    hidden: usize,
    head: usize,
    /// The batch element.
    b: usize,
    /// The block's first query, and its number of queries.
    first: usize,
    rows: usize,
}

impl AttentionBlock {
    /// The block of a grid whose blocks each take `queries` queries (a multiple of 16).
    #[inline(always)]
    fn new(seq: u32, heads: u32, queries: usize) -> Self {
        let (seq, heads) = (seq as usize, heads as usize);
        if seq == 0 || seq > MAX_SEQ || !seq.is_multiple_of(16) {
            arch::trap()
        }
        let first = block::index_x() as usize * queries;
        let (head, b) = (block::index().y as usize, block::index().z as usize);
        Self { seq, heads, hidden: heads * HEAD_DIM, head, b, first, rows: queries.min(seq - first) }
    }

    /// Starts copying rows `0 .. count` of `part` (0: Q, 1: K, 2: V) of this head, from token
    /// `from` of the batch element on, into `tile` (asynchronously: every copy in flight at
    /// once; they land at `shared::wait_async_copies`).
    #[inline(always)]
    fn stage(&self, qkv: &[f16], tile: SharedSlice<f16>, part: usize, from: usize, count: usize) {
        let (token_vectors, head_vectors, tile_vectors) = (3 * self.hidden / 8, HEAD_DIM / 8, TILE_STRIDE / 8);
        let base = (self.b * self.seq + from) * token_vectors + (part * self.hidden + self.head * HEAD_DIM) / 8;
        for i in (thread::rank_in_block() as usize..count * head_vectors).step_by(block::size() as usize) {
            let (row, v) = (i / head_vectors, i % head_vectors);
            tile.copy16_async::<8>(row * tile_vectors + v, qkv, base + row * token_vectors + v);
        }
    }

    /// Thread 0 (the only caller) starts loading rows `0 .. count` (a multiple of 16) of
    /// `part` (0: Q, 1: K, 2: V) of this head, from token `from` of the batch element on,
    /// into `tile` by TMA from `qkv` (the QKV output's tensor map in boxes of [`BOX_TOKENS`]
    /// × 64, 128-byte swizzle: `qkv_map`), a box an instruction, completing on `full`, whose
    /// phase must expect their bytes (`count · 128`). Traps unless `tile` holds the rows,
    /// 1024-aligned.
    #[inline(always)]
    fn stage_boxes(&self, qkv: TensorMap, tile: Swizzled, part: usize, from: usize, count: usize, full: u32) {
        if tile.0.len() < count * HEAD_DIM || !tile.0.addr().is_multiple_of(1024) || !count.is_multiple_of(BOX_TOKENS) {
            arch::trap()
        }
        let (col, token) = (part * self.hidden + self.head * HEAD_DIM, self.b * self.seq + from);
        for row in (0..count).step_by(BOX_TOKENS) {
            // SAFETY: the box's 16 rows lie in the tile, 1024-aligned (checked); nothing reads
            // them before `full`'s phase completes, which expects their bytes (the caller's).
            unsafe { qkv.load_2d(tile.0.addr() + (row * ROW_BYTES) as u32, col as i32, (token + row) as i32, full) };
        }
    }

    /// This warp's first row among the block's queries, or `None` past them.
    #[inline(always)]
    fn warp_rows(&self) -> Option<usize> {
        let row0 = 16 * warp::index_in_block() as usize;
        (row0 < self.rows).then_some(row0)
    }

    /// Row of the `(batch · heads · seq) × seq` scores of the block's query `row`.
    #[inline(always)]
    fn score_row(&self, row: usize) -> usize {
        (self.b * self.heads + self.head) * self.seq + self.first + row
    }

    /// Writes the warp's 16 × 64 context `o · inverse` (per accumulator row: values 0-1 and
    /// 2-3) into the `tokens × hidden` output, its rows from the block's query `row0`.
    #[inline(always)]
    fn store_context(&self, o: &[FragC; COLUMN_TILES], inverse: [f32; 2], row0: usize, out: &Out<f16>) {
        for (j, acc) in o.iter().enumerate() {
            for (i, &value) in acc.values.iter().enumerate() {
                let (r, c) = FragC::position(i);
                let token = self.b * self.seq + self.first + row0 + r;
                out.set(token * self.hidden + self.head * HEAD_DIM + 8 * j + c, f16::from_f32(value * inverse[i / 2]));
            }
        }
    }
}

/// The warp's queries (rows `row0 ..+ 16` of the staged `queries`) as A fragments.
#[inline(always)]
fn query_fragments(queries: impl Layout, row0: usize) -> [FragA<f16>; SLICES] {
    core::array::from_fn(|s| queries.a(row0, 16 * s))
}

/// `q·kᵀ` of the warp's 16 queries with staged keys `kc ..+ 8` and `kc + 8 ..+ 8`.
#[inline(always)]
fn score_chunk(q: &[FragA<f16>; SLICES], keys: impl Layout, kc: usize) -> [FragC; 2] {
    let mut s = [FragC::ZERO; 2];
    for (half, acc) in s.iter_mut().enumerate() {
        for (slice, &qa) in q.iter().enumerate() {
            *acc = mma_m16n8k16(qa, keys.b_n_major(kc + 8 * half, 16 * slice), *acc);
        }
    }
    s
}

/// `o += p · v` for the probabilities `p` of keys `kc ..+ 16` and the staged values.
#[inline(always)]
fn accumulate_context(o: &mut [FragC; COLUMN_TILES], p: FragA<f16>, values: impl Layout, kc: usize) {
    for (j, acc) in o.iter_mut().enumerate() {
        *acc = mma_m16n8k16(p, values.b_k_major(kc, 8 * j), *acc);
    }
}

/// Unfused attention 1/2: `scores[row, j] = scale · q·k_j` (f32), rows `(b · heads + h) · seq
/// + i`. Then [`crate::softmax`].
#[kernel(launch_bounds(max_threads = 128))]
pub fn attention_scores(qkv: &[f16], scores: Out<f32>, seq: u32, heads: u32, scale: f32) {
    let (keys, queries) = (shared!([f16; MAX_SEQ * TILE_STRIDE]), shared!([f16; QUERIES_PER_BLOCK * TILE_STRIDE]));
    let blk = AttentionBlock::new(seq, heads, QUERIES_PER_BLOCK);
    blk.stage(qkv, keys, 1, 0, blk.seq);
    blk.stage(qkv, queries, 0, blk.first, blk.rows);
    shared::wait_async_copies();
    block::sync();
    let Some(row0) = blk.warp_rows() else { return };
    let q = query_fragments(Padded(queries), row0);
    for kc in (0..blk.seq).step_by(16) {
        for (half, tile) in score_chunk(&q, Padded(keys), kc).iter().enumerate() {
            for (i, &value) in tile.values.iter().enumerate() {
                let (r, c) = FragC::position(i);
                scores.set(blk.score_row(row0 + r) * blk.seq + kc + 8 * half + c, scale * value);
            }
        }
    }
}

/// Unfused attention 2/2: the context `Σ_j probs[row, j] · v_j`, merged into `tokens × hidden`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn attention_context(probs: &[f32], qkv: &[f16], out: Out<f16>, seq: u32, heads: u32) {
    let values = shared!([f16; MAX_SEQ * TILE_STRIDE]);
    let blk = AttentionBlock::new(seq, heads, QUERIES_PER_BLOCK);
    blk.stage(qkv, values, 2, 0, blk.seq);
    shared::wait_async_copies();
    block::sync();
    let Some(row0) = blk.warp_rows() else { return };
    let mut o = [FragC::ZERO; COLUMN_TILES];
    for kc in (0..blk.seq).step_by(16) {
        // The probabilities of keys kc ..+ 16 in the accumulator layout, then as an A fragment.
        let p: [FragC; 2] = core::array::from_fn(|half| FragC {
            values: core::array::from_fn(|i| {
                let (r, c) = FragC::position(i);
                probs[blk.score_row(row0 + r) * blk.seq + kc + 8 * half + c]
            }),
        });
        accumulate_context(&mut o, FragA::from_accumulators(p[0], p[1]), Padded(values), kc);
    }
    blk.store_context(&o, [1.0, 1.0], row0, &out);
}

/// Fused attention, after FlashAttention-2: scores of 16 keys at a time, the online
/// softmax's running max and sum per row, and the probabilities fed from registers into
/// `P·V` — nothing of the `seq × seq` scores leaves the SM.
#[kernel(launch_bounds(max_threads = 128))]
pub fn attention(qkv: &[f16], out: Out<f16>, seq: u32, heads: u32, scale: f32) {
    let (keys, values) = (shared!([f16; MAX_SEQ * TILE_STRIDE]), shared!([f16; MAX_SEQ * TILE_STRIDE]));
    let queries = shared!([f16; QUERIES_PER_BLOCK * TILE_STRIDE]);
    let blk = AttentionBlock::new(seq, heads, QUERIES_PER_BLOCK);
    // Launched programmatically after the QKV projection (see `Batch::forward`).
    grid::wait_for_prerequisites();
    grid::launch_dependents();
    blk.stage(qkv, queries, 0, blk.first, blk.rows);
    blk.stage(qkv, keys, 1, 0, blk.seq);
    blk.stage(qkv, values, 2, 0, blk.seq);
    shared::wait_async_copies();
    block::sync();
    let Some(row0) = blk.warp_rows() else { return };
    let q = query_fragments(Padded(queries), row0);
    let scale = scale * core::f32::consts::LOG2_E; // scores in exp2 units
    // This lane's rows g and g + 8 (FragC values 0-1 and 2-3): running max and partial sum.
    let (mut max, mut sum) = ([f32::NEG_INFINITY; 2], [0.0f32; 2]);
    let mut o = [FragC::ZERO; COLUMN_TILES];
    for kc in (0..blk.seq).step_by(16) {
        let mut s = score_chunk(&q, Padded(keys), kc);
        online_softmax_row(&mut s, &mut o, &mut max[0], &mut sum[0], 0, scale);
        online_softmax_row(&mut s, &mut o, &mut max[1], &mut sum[1], 2, scale);
        accumulate_context(&mut o, FragA::from_accumulators(s[0], s[1]), Padded(values), kc);
    }
    for total in &mut sum {
        *total += warp::shuffle_xor(*total, 1);
        *total += warp::shuffle_xor(*total, 2);
    }
    blk.store_context(&o, [1.0 / sum[0], 1.0 / sum[1]], row0, &out);
}

/// Queries per block of [`fn@attention_split`].
pub const SPLIT_QUERIES: usize = 16;
/// f32 words per lane of a warp's partial state in [`attention_split`]: its 32 context
/// accumulators, its two rows' max and sum, and one of padding (an odd stride: a warp's
/// 32 lanes hit 32 distinct banks).
const PARTIAL_WORDS: usize = 4 * COLUMN_TILES + 5;

/// Fused attention for few blocks' worth of work (small batches): [`fn@attention`] with a block
/// per 16 queries of a (batch element, head) — 4× the blocks — whose four warps split the keys
/// (16 at a time, warp `w` chunks `w, w + 4, ..`), each keeping its own running max, sum and
/// context, merged through shared memory at the end (FlashAttention's split-KV within a
/// block): each warp then rescales and stores 16 of the 64 columns. Grid (seq / 16, heads,
/// batch), 128 threads.
#[kernel(launch_bounds(max_threads = 128))]
pub fn attention_split(qkv: &[u64], out: Out<f16>, seq: u32, heads: u32, scale: f32) {
    const WARPS: usize = ATTENTION_WARPS as usize;
    // Q, K and V, 1024-aligned (the swizzle's period) in a region with room to align.
    let staged = shared!([f16; (SPLIT_QUERIES + 2 * MAX_SEQ) * HEAD_DIM + 512]);
    let skip = (staged.addr().next_multiple_of(1024) - staged.addr()) as usize / 2;
    let tile = |row: usize, rows: usize| Swizzled(staged.slice(skip + row * HEAD_DIM, rows * HEAD_DIM));
    let (queries, keys, values) = (tile(0, SPLIT_QUERIES), tile(SPLIT_QUERIES, MAX_SEQ), tile(SPLIT_QUERIES + MAX_SEQ, MAX_SEQ));
    let partials = shared!([f32; ATTENTION_WARPS as usize * 32 * PARTIAL_WORDS]);
    let blk = AttentionBlock::new(seq, heads, SPLIT_QUERIES);
    // One stage of a pipeline: its full barrier, which the three tiles' boxes land on.
    // SAFETY: its own static shared memory, and the block barrier right after.
    let pipeline = unsafe { Pipeline::<2>::new(shared!([u64; 4]), 1) };
    block::sync();
    let start = PipelineState::<2>::START;
    // Launched programmatically after the QKV projection (see `Batch::forward`).
    grid::wait_for_prerequisites();
    grid::launch_dependents();
    if thread::rank_in_block() == 0 {
        let (map, full) = (TensorMap::new(qkv), pipeline.producer_acquire(start, ((SPLIT_QUERIES + 2 * blk.seq) * ROW_BYTES) as u32));
        blk.stage_boxes(map, queries, 0, blk.first, SPLIT_QUERIES, full);
        blk.stage_boxes(map, keys, 1, 0, blk.seq, full);
        blk.stage_boxes(map, values, 2, 0, blk.seq, full);
    }
    pipeline.consumer_wait(start);
    let (w, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let q = query_fragments(queries, 0);
    let scale = scale * core::f32::consts::LOG2_E; // scores in exp2 units
    // As in `attention`, over this warp's keys (none at all when seq < 16 · (w + 1): max
    // stays -∞ and the merge weighs the warp by 0).
    let (mut max, mut sum) = ([f32::NEG_INFINITY; 2], [0.0f32; 2]);
    let mut o = [FragC::ZERO; COLUMN_TILES];
    for kc in (16 * w..blk.seq).step_by(16 * WARPS) {
        let mut s = score_chunk(&q, keys, kc);
        online_softmax_row(&mut s, &mut o, &mut max[0], &mut sum[0], 0, scale);
        online_softmax_row(&mut s, &mut o, &mut max[1], &mut sum[1], 2, scale);
        accumulate_context(&mut o, FragA::from_accumulators(s[0], s[1]), values, kc);
    }
    for total in &mut sum {
        *total += warp::shuffle_xor(*total, 1);
        *total += warp::shuffle_xor(*total, 2);
    }
    // Word `i` of lane `lane`'s state in warp `p`'s partial.
    let at = |p: usize, i: usize| (p * 32 + lane) * PARTIAL_WORDS + i;
    for (j, acc) in o.iter().enumerate() {
        for (v, &value) in acc.values.iter().enumerate() {
            partials.store(at(w, 4 * j + v), value);
        }
    }
    for r in 0..2 {
        partials.store(at(w, 4 * COLUMN_TILES + r), max[r]);
        partials.store(at(w, 4 * COLUMN_TILES + 2 + r), sum[r]);
    }
    block::sync();
    // Every lane's rows are the same in every warp: merge lane by lane, in warp order.
    let maxes: [[f32; 2]; WARPS] = core::array::from_fn(|p| core::array::from_fn(|r| partials.load(at(p, 4 * COLUMN_TILES + r))));
    let merged: [f32; 2] = core::array::from_fn(|r| maxes.iter().fold(f32::NEG_INFINITY, |m, p| m.max(p[r])));
    let weights: [[f32; 2]; WARPS] = core::array::from_fn(|p| core::array::from_fn(|r| math::exp2(maxes[p][r] - merged[r])));
    let inverse: [f32; 2] =
        core::array::from_fn(|r| 1.0 / (0..WARPS).fold(0.0, |total, p| partials.load(at(p, 4 * COLUMN_TILES + 2 + r)).fma(weights[p][r], total)));
    let row0 = blk.b * blk.seq + blk.first;
    for j in (COLUMN_TILES / WARPS * w..).take(COLUMN_TILES / WARPS) {
        for v in 0..4 {
            let value = (0..WARPS).fold(0.0, |acc: f32, p| partials.load(at(p, 4 * j + v)).fma(weights[p][v / 2], acc));
            let (r, c) = FragC::position(v);
            out.set((row0 + r) * blk.hidden + blk.head * HEAD_DIM + 8 * j + c, f16::from_f32(value * inverse[v / 2]));
        }
    }
}

/// One step of the online softmax for the accumulator row whose values are `v`, `v + 1`
/// (0: row g, 2: row g + 8; a constant, so that every index is one): the row's max over the
/// new scores `s` (across its 4 lanes), the rescaling of the running `sum` and output `o`,
/// and `s` replaced by the probabilities `exp2(scale · s − max)`.
#[inline(always)]
fn online_softmax_row(s: &mut [FragC; 2], o: &mut [FragC; COLUMN_TILES], max: &mut f32, sum: &mut f32, v: usize, scale: f32) {
    let chunk = s[0].values[v].max(s[0].values[v + 1]).max(s[1].values[v].max(s[1].values[v + 1])) * scale;
    let chunk = chunk.max(warp::shuffle_xor(chunk, 1));
    let chunk = chunk.max(warp::shuffle_xor(chunk, 2)); // over the row's 4 lanes
    let new_max = max.max(chunk);
    let correction = math::exp2(*max - new_max);
    *max = new_max;
    *sum *= correction;
    for acc in o.iter_mut() {
        acc.values[v] *= correction;
        acc.values[v + 1] *= correction;
    }
    for tile in s.iter_mut() {
        tile.values[v] = math::exp2(tile.values[v].fma(scale, -new_max));
        tile.values[v + 1] = math::exp2(tile.values[v + 1].fma(scale, -new_max));
        *sum += tile.values[v] + tile.values[v + 1];
    }
}

/// Fused `out = LayerNorm(x + b) · γ + β`, the norms' stages in one kernel; launched as
/// the unfused norm kernels ([`row_config`](crate::norms::row_config)).
#[kernel(launch_bounds(max_threads = 1024))]
pub fn bias_layer_norm(x: &[f16], b: &[f16], gamma: &[f16], beta: &[f16], out: Out<f16>, hidden: u32) {
    // Launched programmatically after a projection (see `Batch::forward`): `add_bias` loads b,
    // then lets the next kernel launch and waits for the projection.
    store_row(layernorm_gelu::layer_norm(layernorm_gelu::add_bias(x, b), gamma, beta, hidden), &out);
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host;
