//! 11 — a BERT-base encoder (post-LN, fp16) out of the earlier examples' kernels, two ways.
//! **Unfused**, one kernel per op as a framework launches them (16 per layer): the QKV
//! projection, its bias, attention scores (batched Q·Kᵀ / √64), example 04's softmax, the
//! context P·V, the output projection, its bias, the residual add, LayerNorm, the FFN's up
//! projection, bias, GELU, down projection, bias, residual add and LayerNorm — projections on
//! example 10's tensor-core GEMM, element-wise ops and norms from example 08. **Fused**, the
//! chains the proximity advice finds (7 per layer): GEMMs with bias, bias + GELU and residual
//! epilogues, one attention kernel (FlashAttention-2 style on the tensor cores: scores,
//! online softmax and context of 16 queries per warp in registers), and bias + LayerNorm in
//! one kernel.
//!
//! Attention runs one warp per (batch element, head, query) row, reading Q, K and V from the
//! QKV projection's output (`tokens × 3·hidden`: Q, K, V side by side, head `h` at columns
//! `64 h ..+ 64` of each) and writing the context merged back to `tokens × hidden`. The two
//! modes differ in GELU: the unfused kernel uses erf (BERT's definition), the GEMM epilogue
//! the tanh form; each is checked against an f64 reference of its own.

use crate::fused_norms::{layernorm_gelu, store_row};
use clusterfuse::arch;
use clusterfuse::mma::{mma_m16n8k16, FragA, FragB, FragC};
use clusterfuse::prelude::*;

/// Elements per head.
pub const HEAD_DIM: usize = 64;
/// The longest sequence: 4 keys per lane of the row's warp.
pub const MAX_SEQ: usize = 128;
const SLOTS: usize = MAX_SEQ / 32;
/// Attention rows (warps) per block of the attention kernels.
pub const ROWS_PER_BLOCK: u32 = 8;

/// One attention row: the warp's (batch element `b`, head `h`, query `i`).
struct AttentionRow {
    /// `(b · heads + h) · seq + i`: the row of the scores.
    row: usize,
    seq: usize,
    /// Element offsets in the QKV output of the query, and of the key of token 0 of `b`.
    query: usize,
    key0: usize,
    /// Elements between consecutive tokens of the QKV output (3 · hidden), and from a key to its value.
    stride: usize,
    hidden: usize,
    /// Element offset of the row's context in the `tokens × hidden` output.
    out: usize,
}

/// This warp's row, or `None` past the last one. Traps on a sequence longer than [`MAX_SEQ`].
#[inline(always)]
fn attention_row(qkv: &[f16], seq: u32, heads: u32) -> Option<AttentionRow> {
    let (seq, heads) = (seq as usize, heads as usize);
    if seq > MAX_SEQ || seq == 0 {
        arch::trap()
    }
    let (hidden, row) = (heads * HEAD_DIM, (block::index_x() * ROWS_PER_BLOCK + warp::index_in_block()) as usize);
    let stride = 3 * hidden;
    if row >= qkv.len() / stride * heads {
        return None;
    }
    let (i, b, h) = (row % seq, row / seq / heads, row / seq % heads);
    let token = b * seq + i;
    Some(AttentionRow {
        row,
        seq,
        query: token * stride + h * HEAD_DIM,
        key0: b * seq * stride + hidden + h * HEAD_DIM,
        stride,
        hidden,
        out: token * hidden + h * HEAD_DIM,
    })
}

/// This lane's scores `scale · q·k_j` for keys `j = lane + 32 s` (−∞ past the sequence).
#[inline(always)]
fn scores(qkv: &[f16], r: &AttentionRow, scale: f32) -> [f32; SLOTS] {
    let lane = warp::lane() as usize;
    core::array::from_fn(|s| {
        let j = lane + 32 * s;
        if j >= r.seq {
            return f32::NEG_INFINITY;
        }
        let (q, k) = (r.query / 8, (r.key0 + j * r.stride) / 8);
        let mut dot = 0.0f32;
        for v in 0..HEAD_DIM / 8 {
            let (qv, kv) = (global::load16::<f16, 8>(qkv, q + v), global::load16::<f16, 8>(qkv, k + v));
            for e in 0..8 {
                dot = qv[e].to_f32().fma(kv[e].to_f32(), dot);
            }
        }
        scale * dot
    })
}

/// Writes the row's context `Σ_j p(j) v_j` (lane `l` owns elements `2l`, `2l + 1`).
#[inline(always)]
fn context(qkv: &[f16], r: &AttentionRow, p: impl Fn(usize) -> f32, out: &Out<f16>) {
    let lane = warp::lane() as usize;
    let value0 = r.key0 + r.hidden + 2 * lane;
    let (mut c0, mut c1) = (0.0f32, 0.0f32);
    for j in 0..r.seq {
        let (pj, v) = (p(j), value0 + j * r.stride);
        c0 = pj.fma(qkv[v].to_f32(), c0);
        c1 = pj.fma(qkv[v + 1].to_f32(), c1);
    }
    out.set(r.out + 2 * lane, f16::from_f32(c0));
    out.set(r.out + 2 * lane + 1, f16::from_f32(c1));
}

/// Unfused attention 1/2: `scores[row, j] = scale · q·k_j` (f32), one warp per row of
/// `batch · heads · seq`; grid ⌈rows / 8⌉, 256 threads. Then example 04's softmax.
#[kernel(launch_bounds(max_threads = 256))]
pub fn attention_scores(qkv: &[f16], scores: Out<f32>, seq: u32, heads: u32, scale: f32) {
    let Some(r) = attention_row(qkv, seq, heads) else { return };
    let lane = warp::lane() as usize;
    for (s, &value) in self::scores(qkv, &r, scale).iter().enumerate() {
        if lane + 32 * s < r.seq {
            scores.set(r.row * r.seq + lane + 32 * s, value);
        }
    }
}

/// Unfused attention 2/2: the context `Σ_j probs[row, j] · v_j`, merged into `tokens × hidden`;
/// launched as [`attention_scores`].
#[kernel(launch_bounds(max_threads = 256))]
pub fn attention_context(probs: &[f32], qkv: &[f16], out: Out<f16>, seq: u32, heads: u32) {
    let Some(r) = attention_row(qkv, seq, heads) else { return };
    context(qkv, &r, |j| probs[r.row * r.seq + j], &out);
}

/// Queries per block of [`attention`]: 16 per warp (one `mma` tile of rows).
pub const QUERIES_PER_BLOCK: usize = 16 * ATTENTION_WARPS as usize;
/// Warps per block of [`attention`].
pub const ATTENTION_WARPS: u32 = 4;
/// Row stride of the staged Q, K and V tiles, in halves: a row of 64 plus 16 bytes, so the
/// eight rows an `ldmatrix` reads fall in distinct banks.
const TILE_STRIDE: usize = HEAD_DIM + 8;

/// Fused attention on the tensor cores, after FlashAttention-2: block (x, h, b) takes
/// queries `64 x ..+ 64` of head `h` of batch element `b`. It stages the sequence's K and V
/// and its queries in shared memory (16-byte loads); each warp then multiplies its 16 queries
/// with 16 keys at a time (`mma`), keeps the online softmax's running max and sum per row,
/// and feeds the probabilities from registers into `P·V`. Grid (⌈seq / 64⌉, heads, batch),
/// 128 threads; `seq` a multiple of 16 up to [`MAX_SEQ`] (traps otherwise).
#[kernel(launch_bounds(max_threads = 128))]
pub fn attention(qkv: &[f16], out: Out<f16>, seq: u32, heads: u32, scale: f32) {
    let keys = shared!([f16; MAX_SEQ * TILE_STRIDE]);
    let values = shared!([f16; MAX_SEQ * TILE_STRIDE]);
    let queries = shared!([f16; QUERIES_PER_BLOCK * TILE_STRIDE]);
    let (seq, hidden) = (seq as usize, heads as usize * HEAD_DIM);
    if seq == 0 || seq > MAX_SEQ || !seq.is_multiple_of(16) {
        arch::trap()
    }
    let (first, head, b) = (block::index_x() as usize * QUERIES_PER_BLOCK, block::index().y as usize, block::index().z as usize);
    let rows = QUERIES_PER_BLOCK.min(seq - first);
    // 16-byte vectors: of a token's QKV row, of a head's 64 elements, of a staged row.
    let (token_vectors, head_vectors, tile_vectors) = (3 * hidden / 8, HEAD_DIM / 8, TILE_STRIDE / 8);
    let q_vector = |token: usize| (b * seq + token) * token_vectors + head * head_vectors;
    let t = thread::rank_in_block() as usize;
    for i in (t..seq * head_vectors).step_by(block::size() as usize) {
        let (j, v) = (i / head_vectors, i % head_vectors);
        let src = q_vector(j) + v;
        keys.store16(j * tile_vectors + v, global::load16::<f16, 8>(qkv, src + hidden / 8));
        values.store16(j * tile_vectors + v, global::load16::<f16, 8>(qkv, src + 2 * hidden / 8));
        if j < rows {
            queries.store16(j * tile_vectors + v, global::load16::<f16, 8>(qkv, q_vector(first + j) + v));
        }
    }
    block::sync();

    let row0 = 16 * warp::index_in_block() as usize;
    if row0 >= rows {
        return;
    }
    let q: [FragA<f16>; HEAD_DIM / 16] = core::array::from_fn(|s| FragA::load(queries, TILE_STRIDE, row0, 16 * s));
    let scale = scale * core::f32::consts::LOG2_E; // scores in exp2 units
    // This lane's rows g and g + 8 (FragC values 0-1 and 2-3): running max and partial sum.
    let (mut max, mut sum) = ([f32::NEG_INFINITY; 2], [0.0f32; 2]);
    let mut o = [FragC::ZERO; HEAD_DIM / 8];
    for kc in (0..seq).step_by(16) {
        // Scores of keys kc ..+ 8 and kc + 8 ..+ 8.
        let mut s = [FragC::ZERO; 2];
        for (half, acc) in s.iter_mut().enumerate() {
            for (slice, &qa) in q.iter().enumerate() {
                *acc = mma_m16n8k16(qa, FragB::load_n_major(keys, TILE_STRIDE, kc + 8 * half, 16 * slice), *acc);
            }
        }
        online_softmax_row(&mut s, &mut o, &mut max[0], &mut sum[0], 0, scale);
        online_softmax_row(&mut s, &mut o, &mut max[1], &mut sum[1], 2, scale);
        let p = FragA::<f16>::from_accumulators(s[0], s[1]);
        for (j, acc) in o.iter_mut().enumerate() {
            *acc = mma_m16n8k16(p, FragB::load_k_major(values, TILE_STRIDE, kc, 8 * j), *acc);
        }
    }
    for total in &mut sum {
        *total += warp::shuffle_xor(*total, 1);
        *total += warp::shuffle_xor(*total, 2);
    }
    let inverse = [1.0 / sum[0], 1.0 / sum[1]];
    for (j, acc) in o.iter().enumerate() {
        for (i, &value) in acc.values.iter().enumerate() {
            let (r, c) = FragC::position(i);
            let token = b * seq + first + row0 + r;
            out.set(token * hidden + head * HEAD_DIM + 8 * j + c, f16::from_f32(value * inverse[i / 2]));
        }
    }
}

/// One step of the online softmax for the accumulator row whose values are `v`, `v + 1`
/// (0: row g, 2: row g + 8; a constant, so that every index is one): the row's max over the
/// new scores `s` (across its 4 lanes), the rescaling of the running `sum` and output `o`,
/// and `s` replaced by the probabilities `exp2(scale · s − max)`.
#[inline(always)]
fn online_softmax_row(s: &mut [FragC; 2], o: &mut [FragC; HEAD_DIM / 8], max: &mut f32, sum: &mut f32, v: usize, scale: f32) {
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

/// Fused `out = LayerNorm(x + b) · γ + β`, example 08's stages in one kernel; launched as
/// example 08's unfused kernels ([`row_config`](crate::fused_norms::row_config)).
#[kernel(launch_bounds(max_threads = 1024))]
pub fn bias_layer_norm(x: &[f16], b: &[f16], gamma: &[f16], beta: &[f16], out: Out<f16>, hidden: u32) {
    store_row(layernorm_gelu::layer_norm(layernorm_gelu::add_bias(x, b), gamma, beta, hidden), &out);
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::*;
    use crate::check::{shape, with_rng, Report};
    use crate::fused_norms::{self, add_bias, add_residual, gelu_kernel, layer_norm, row_config};
    use crate::gemm::{self, gemm_f16, gemm_f16_bias, gemm_f16_bias_gelu, gemm_f16_residual, GemmError};
    use crate::softmax::softmax;
    use clusterfuse::host::{Buffer, Gpu, Result, Stream};
    use clusterfuse::Dim3;
    use rand::Rng;

    /// An encoder's sizes.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Dims {
        pub layers: usize,
        pub hidden: usize,
        pub heads: usize,
        pub ffn: usize,
        /// Tokens per batch element.
        pub seq: usize,
    }

    /// BERT-base at sequence length 128.
    pub const BERT_BASE: Dims = Dims { layers: 12, hidden: 768, heads: 12, ffn: 3072, seq: 128 };

    /// The emulator's encoder: the norms' smallest hidden size, 4 heads of 64, 16 tokens.
    pub const TINY: Dims = Dims { layers: 2, hidden: 256, heads: 4, ffn: 512, seq: 80 };

    impl Dims {
        /// Why the kernels cannot run an encoder of these sizes, if they cannot.
        pub fn check(&self) -> std::result::Result<(), String> {
            let mut why = Vec::new();
            if self.hidden != self.heads * HEAD_DIM {
                why.push(format!("hidden {} is not heads {} × {HEAD_DIM}", self.hidden, self.heads));
            }
            if !self.hidden.is_multiple_of(256) || 3 * self.hidden > fused_norms::MAX_HIDDEN as usize {
                why.push(format!("hidden {} must be a multiple of 256, and 3 × hidden at most {}", self.hidden, fused_norms::MAX_HIDDEN));
            }
            if !self.ffn.is_multiple_of(256) || self.ffn > fused_norms::MAX_HIDDEN as usize {
                why.push(format!("ffn {} must be a multiple of 256 and at most {}", self.ffn, fused_norms::MAX_HIDDEN));
            }
            if self.seq == 0 || self.seq > MAX_SEQ || !self.seq.is_multiple_of(16) {
                why.push(format!("seq {} must be a multiple of 16 in 16..={MAX_SEQ}", self.seq));
            }
            if why.is_empty() { Ok(()) } else { Err(why.join("; ")) }
        }
    }

    /// One layer's weights on the host: projections `in × out`, row-major.
    pub struct HostLayer {
        pub wqkv: Vec<f16>,
        pub bqkv: Vec<f16>,
        pub wo: Vec<f16>,
        pub bo: Vec<f16>,
        pub gamma1: Vec<f16>,
        pub beta1: Vec<f16>,
        pub w1: Vec<f16>,
        pub b1: Vec<f16>,
        pub w2: Vec<f16>,
        pub b2: Vec<f16>,
        pub gamma2: Vec<f16>,
        pub beta2: Vec<f16>,
    }

    impl HostLayer {
        /// Random weights: projections uniform with variance 1/in (activations keep their
        /// scale), biases and β in ±0.1, γ in 1 ± 0.1.
        pub fn random(d: &Dims) -> Self {
            with_rng(|rng| {
                let mut uniform = |len: usize, centre: f32, half: f32| -> Vec<f16> {
                    (0..len).map(|_| f16::from_f32(centre + rng.random_range(-half..half))).collect()
                };
                let (h, f) = (d.hidden, d.ffn);
                let w = |fan_in: usize| (3.0 / fan_in as f32).sqrt();
                Self {
                    wqkv: uniform(h * 3 * h, 0.0, w(h)),
                    bqkv: uniform(3 * h, 0.0, 0.1),
                    wo: uniform(h * h, 0.0, w(h)),
                    bo: uniform(h, 0.0, 0.1),
                    gamma1: uniform(h, 1.0, 0.1),
                    beta1: uniform(h, 0.0, 0.1),
                    w1: uniform(h * f, 0.0, w(h)),
                    b1: uniform(f, 0.0, 0.1),
                    w2: uniform(f * h, 0.0, w(f)),
                    b2: uniform(h, 0.0, 0.1),
                    gamma2: uniform(h, 1.0, 0.1),
                    beta2: uniform(h, 0.0, 0.1),
                }
            })
        }
    }

    /// One layer's weights on a device, as [`HostLayer`].
    pub struct Layer {
        wqkv: Buffer<f16>,
        bqkv: Buffer<f16>,
        wo: Buffer<f16>,
        bo: Buffer<f16>,
        gamma1: Buffer<f16>,
        beta1: Buffer<f16>,
        w1: Buffer<f16>,
        b1: Buffer<f16>,
        w2: Buffer<f16>,
        b2: Buffer<f16>,
        gamma2: Buffer<f16>,
        beta2: Buffer<f16>,
    }

    impl Layer {
        pub fn upload(gpu: &Gpu, l: &HostLayer) -> Result<Self> {
            Ok(Self {
                wqkv: gpu.upload(&l.wqkv)?,
                bqkv: gpu.upload(&l.bqkv)?,
                wo: gpu.upload(&l.wo)?,
                bo: gpu.upload(&l.bo)?,
                gamma1: gpu.upload(&l.gamma1)?,
                beta1: gpu.upload(&l.beta1)?,
                w1: gpu.upload(&l.w1)?,
                b1: gpu.upload(&l.b1)?,
                w2: gpu.upload(&l.w2)?,
                b2: gpu.upload(&l.b2)?,
                gamma2: gpu.upload(&l.gamma2)?,
                beta2: gpu.upload(&l.beta2)?,
            })
        }
    }

    /// How the layers are launched.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Mode {
        /// One kernel per op.
        Unfused,
        /// Epilogues, fused attention, bias + LayerNorm.
        Fused,
    }

    impl Mode {
        pub const ALL: [Mode; 2] = [Self::Unfused, Self::Fused];

        pub fn name(self) -> &'static str {
            match self {
                Self::Unfused => "unfused",
                Self::Fused => "fused",
            }
        }

        /// Kernel launches per layer.
        pub fn kernels_per_layer(self) -> usize {
            match self {
                Self::Unfused => 16,
                Self::Fused => 7,
            }
        }

        /// The GELU it computes.
        pub fn gelu(self) -> Gelu {
            match self {
                Self::Unfused => Gelu::Erf,
                Self::Fused => Gelu::Tanh,
            }
        }
    }

    /// The kernels of both modes, loaded once.
    pub struct Kernels {
        gemm: gemm_f16::Kernel,
        gemm_bias: gemm_f16_bias::Kernel,
        gemm_bias_gelu: gemm_f16_bias_gelu::Kernel,
        gemm_residual: gemm_f16_residual::Kernel,
        add_bias: add_bias::Kernel,
        add_residual: add_residual::Kernel,
        layer_norm: layer_norm::Kernel,
        gelu: gelu_kernel::Kernel,
        scores: attention_scores::Kernel,
        softmax: softmax::Kernel,
        context: attention_context::Kernel,
        attention: attention::Kernel,
        bias_layer_norm: bias_layer_norm::Kernel,
    }

    impl Kernels {
        pub fn load(gpu: &Gpu) -> Result<Self> {
            Ok(Self {
                gemm: gemm_f16::load(gpu)?,
                gemm_bias: gemm_f16_bias::load(gpu)?,
                gemm_bias_gelu: gemm_f16_bias_gelu::load(gpu)?,
                gemm_residual: gemm_f16_residual::load(gpu)?,
                add_bias: add_bias::load(gpu)?,
                add_residual: add_residual::load(gpu)?,
                layer_norm: layer_norm::load(gpu)?,
                gelu: gelu_kernel::load(gpu)?,
                scores: attention_scores::load(gpu)?,
                softmax: softmax::load(gpu)?,
                context: attention_context::load(gpu)?,
                attention: attention::load(gpu)?,
                bias_layer_norm: bias_layer_norm::load(gpu)?,
            })
        }
    }

    /// A model: its sizes and its layers' weights, on the host and on a device.
    pub struct Model {
        pub dims: Dims,
        pub host: Vec<HostLayer>,
        layers: Vec<Layer>,
    }

    impl Model {
        /// Random weights for `dims.layers` layers, uploaded to `gpu`.
        pub fn random(gpu: &Gpu, dims: Dims) -> Result<Self> {
            let host: Vec<HostLayer> = (0..dims.layers).map(|_| HostLayer::random(&dims)).collect();
            let layers = host.iter().map(|l| Layer::upload(gpu, l)).collect::<Result<_>>()?;
            Ok(Self { dims, host, layers })
        }
    }

    /// One batch size's activations (all poisoned with NaN until written) and launch
    /// configurations. `x` holds the input and, after a forward pass, the output.
    pub struct Batch {
        pub tokens: usize,
        pub x: Buffer<f16>,
        h1: Buffer<f16>,
        ctx: Buffer<f16>,
        proj: Buffer<f16>,
        biased: Buffer<f16>,
        summed: Buffer<f16>,
        qkv_raw: Buffer<f16>,
        qkv: Buffer<f16>,
        up_raw: Buffer<f16>,
        up_biased: Buffer<f16>,
        up: Buffer<f16>,
        scores: Buffer<f32>,
        probs: Buffer<f32>,
        qkv_config: LaunchConfig,
        o_config: LaunchConfig,
        up_config: LaunchConfig,
        down_config: LaunchConfig,
        rows: LaunchConfig,
        rows_qkv: LaunchConfig,
        rows_up: LaunchConfig,
        /// The fused attention's launch, and the unfused attention's (a warp per row).
        attention: LaunchConfig,
        per_row: LaunchConfig,
        softmax: LaunchConfig,
    }

    impl Batch {
        /// Buffers for `batch` sequences of `dims`, with the input `x` (`tokens × hidden`).
        pub fn new(gpu: &Gpu, dims: &Dims, batch: usize, x: &[f16]) -> std::result::Result<Self, GemmError> {
            dims.check().map_err(GemmError::Shape)?;
            let (tokens, h, f) = (batch * dims.seq, dims.hidden, dims.ffn);
            assert_eq!(x.len(), tokens * h, "the input is tokens × hidden");
            let poisoned = |len: usize| gpu.upload(&vec![f16::NAN; len]);
            let rows = (tokens * dims.heads) as u32;
            let per_row = LaunchConfig { grid: rows.div_ceil(ROWS_PER_BLOCK).into(), block: (32 * ROWS_PER_BLOCK).into(), ..LaunchConfig::default() };
            Ok(Self {
                tokens,
                x: gpu.upload(x)?,
                h1: poisoned(tokens * h)?,
                ctx: poisoned(tokens * h)?,
                proj: poisoned(tokens * h)?,
                biased: poisoned(tokens * h)?,
                summed: poisoned(tokens * h)?,
                qkv_raw: poisoned(tokens * 3 * h)?,
                qkv: poisoned(tokens * 3 * h)?,
                up_raw: poisoned(tokens * f)?,
                up_biased: poisoned(tokens * f)?,
                up: poisoned(tokens * f)?,
                scores: gpu.upload(&vec![f32::NAN; rows as usize * dims.seq])?,
                probs: gpu.upload(&vec![f32::NAN; rows as usize * dims.seq])?,
                qkv_config: gemm::config(tokens, 3 * h, h)?,
                o_config: gemm::config(tokens, h, h)?,
                up_config: gemm::config(tokens, f, h)?,
                down_config: gemm::config(tokens, h, f)?,
                rows: row_config(h as u32, tokens as u32),
                rows_qkv: row_config(3 * h as u32, tokens as u32),
                rows_up: row_config(f as u32, tokens as u32),
                attention: LaunchConfig {
                    grid: Dim3::new(dims.seq.div_ceil(QUERIES_PER_BLOCK) as u32, dims.heads as u32, batch as u32),
                    block: (32 * ATTENTION_WARPS).into(),
                    ..LaunchConfig::default()
                },
                per_row,
                softmax: per_row,
            })
        }

        /// Launches every layer of `model` on `s`, in `mode`: `x` becomes the encoder's output.
        pub fn forward(&mut self, s: &Stream, k: &Kernels, model: &Model, mode: Mode) -> Result<()> {
            let d = &model.dims;
            let (t, h, f, seq, heads) = (self.tokens as u32, d.hidden as u32, d.ffn as u32, d.seq as u32, d.heads as u32);
            let scale = 1.0 / (HEAD_DIM as f32).sqrt();
            for l in &model.layers {
                match mode {
                    Mode::Unfused => {
                        k.gemm.launch(s, &self.qkv_config, &self.x, &l.wqkv, &mut self.qkv_raw, t, 3 * h, h)?;
                        k.add_bias.launch(s, &self.rows_qkv, &self.qkv_raw, &l.bqkv, &mut self.qkv)?;
                        k.scores.launch(s, &self.per_row, &self.qkv, &mut self.scores, seq, heads, scale)?;
                        k.softmax.launch(s, &self.softmax, &self.scores, &mut self.probs, seq)?;
                        k.context.launch(s, &self.per_row, &self.probs, &self.qkv, &mut self.ctx, seq, heads)?;
                        k.gemm.launch(s, &self.o_config, &self.ctx, &l.wo, &mut self.proj, t, h, h)?;
                        k.add_bias.launch(s, &self.rows, &self.proj, &l.bo, &mut self.biased)?;
                        k.add_residual.launch(s, &self.rows, &self.biased, &self.x, &mut self.summed)?;
                        k.layer_norm.launch(s, &self.rows, &self.summed, &l.gamma1, &l.beta1, &mut self.h1, h)?;
                        k.gemm.launch(s, &self.up_config, &self.h1, &l.w1, &mut self.up_raw, t, f, h)?;
                        k.add_bias.launch(s, &self.rows_up, &self.up_raw, &l.b1, &mut self.up_biased)?;
                        k.gelu.launch(s, &self.rows_up, &self.up_biased, &mut self.up)?;
                        k.gemm.launch(s, &self.down_config, &self.up, &l.w2, &mut self.proj, t, h, f)?;
                        k.add_bias.launch(s, &self.rows, &self.proj, &l.b2, &mut self.biased)?;
                        k.add_residual.launch(s, &self.rows, &self.biased, &self.h1, &mut self.summed)?;
                        k.layer_norm.launch(s, &self.rows, &self.summed, &l.gamma2, &l.beta2, &mut self.x, h)?;
                    }
                    Mode::Fused => {
                        k.gemm_bias.launch(s, &self.qkv_config, &self.x, &l.wqkv, &l.bqkv, &mut self.qkv, t, 3 * h, h)?;
                        k.attention.launch(s, &self.attention, &self.qkv, &mut self.ctx, seq, heads, scale)?;
                        k.gemm_residual.launch(s, &self.o_config, &self.ctx, &l.wo, &self.x, &mut self.summed, t, h, h)?;
                        k.bias_layer_norm.launch(s, &self.rows, &self.summed, &l.bo, &l.gamma1, &l.beta1, &mut self.h1, h)?;
                        k.gemm_bias_gelu.launch(s, &self.up_config, &self.h1, &l.w1, &l.b1, &mut self.up, t, f, h)?;
                        k.gemm_residual.launch(s, &self.down_config, &self.up, &l.w2, &self.h1, &mut self.summed, t, h, f)?;
                        k.bias_layer_norm.launch(s, &self.rows, &self.summed, &l.b2, &l.gamma2, &l.beta2, &mut self.x, h)?;
                    }
                }
            }
            Ok(())
        }
    }

    /// GELU's two forms.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Gelu {
        /// `x Φ(x)` with the exact erf.
        Erf,
        /// `0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`.
        Tanh,
    }

    impl Gelu {
        fn of(self, x: f64) -> f64 {
            match self {
                Self::Erf => 0.5 * x * (1.0 + fused_norms::reference::erf(x / std::f64::consts::SQRT_2)),
                Self::Tanh => 0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh()),
            }
        }
    }

    /// The f64 reference of the encoder on `x` (`batch · seq × hidden`), with GELU `gelu`.
    pub fn reference(dims: &Dims, layers: &[HostLayer], x: &[f16], gelu: Gelu) -> Vec<f64> {
        let wide = |v: &[f16]| -> Vec<f64> { v.iter().map(|h| h.to_f64()).collect() };
        let (h, f, seq) = (dims.hidden, dims.ffn, dims.seq);
        let tokens = x.len() / h;
        let mut x = wide(x);
        for l in layers {
            let qkv = linear(&x, &wide(&l.wqkv), &wide(&l.bqkv), 3 * h);
            let mut ctx = vec![0.0; tokens * h];
            for (token, out) in ctx.chunks_mut(h).enumerate() {
                let first = token / seq * seq;
                for head in 0..dims.heads {
                    let at = |t: usize, part: usize| &qkv[t * 3 * h + part * h + head * HEAD_DIM..][..HEAD_DIM];
                    let q = at(token, 0);
                    let scores: Vec<f64> = (first..first + seq).map(|t| q.iter().zip(at(t, 1)).map(|(a, b)| a * b).sum::<f64>() / (HEAD_DIM as f64).sqrt()).collect();
                    let max = scores.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
                    let exps: Vec<f64> = scores.iter().map(|v| (v - max).exp()).collect();
                    let sum: f64 = exps.iter().sum();
                    for (j, e) in exps.iter().enumerate() {
                        for (o, v) in out[head * HEAD_DIM..][..HEAD_DIM].iter_mut().zip(at(first + j, 2)) {
                            *o += e / sum * v;
                        }
                    }
                }
            }
            let mut a = linear(&ctx, &wide(&l.wo), &wide(&l.bo), h);
            a.iter_mut().zip(&x).for_each(|(a, x)| *a += x);
            let h1 = layer_norm_ref(&a, &wide(&l.gamma1), &wide(&l.beta1));
            let up: Vec<f64> = linear(&h1, &wide(&l.w1), &wide(&l.b1), f).into_iter().map(|v| gelu.of(v)).collect();
            let mut o = linear(&up, &wide(&l.w2), &wide(&l.b2), h);
            o.iter_mut().zip(&h1).for_each(|(o, h)| *o += h);
            x = layer_norm_ref(&o, &wide(&l.gamma2), &wide(&l.beta2));
        }
        x
    }

    /// `x · w + b` for `x` of rows × in and `w` in × `n`.
    fn linear(x: &[f64], w: &[f64], b: &[f64], n: usize) -> Vec<f64> {
        let k = w.len() / n;
        x.chunks(k)
            .flat_map(|row| {
                let mut out = b.to_vec();
                for (xi, wrow) in row.iter().zip(w.chunks(n)) {
                    out.iter_mut().zip(wrow).for_each(|(o, w)| *o += xi * w);
                }
                out
            })
            .collect()
    }

    fn layer_norm_ref(x: &[f64], gamma: &[f64], beta: &[f64]) -> Vec<f64> {
        let h = gamma.len();
        x.chunks(h)
            .flat_map(|row| {
                let mean = row.iter().sum::<f64>() / h as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / h as f64;
                let rstd = 1.0 / (var + fused_norms::EPS as f64).sqrt();
                (0..h).map(move |i| (row[i] - mean) * rstd * gamma[i] + beta[i])
            })
            .collect()
    }

    /// Relative error allowed against the f64 reference: f16 activations (2^-11) rounded at
    /// every kernel boundary over two layers, `ex2.approx` and `tanh.approx`.
    pub const TOLERANCE: f64 = 3e-3;

    /// Runs both modes on the same random input and weights and compares each output with
    /// its f64 reference: `dims` at `batch`.
    pub fn check(gpu: &Gpu, dims: Dims, batch: usize) -> std::result::Result<Report, GemmError> {
        let model = Model::random(gpu, dims)?;
        let kernels = Kernels::load(gpu)?;
        let x: Vec<f16> = crate::check::random(batch * dims.seq * dims.hidden).into_iter().map(f16::from_f32).collect();
        let (mut outs, mut refs) = (Vec::new(), Vec::new());
        for mode in Mode::ALL {
            let mut b = Batch::new(gpu, &dims, batch, &x)?;
            b.forward(gpu.stream(), &kernels, &model, mode)?;
            outs.extend(gpu.download(&b.x)?.iter().map(|v| v.to_f32()));
            refs.extend(reference(&dims, &model.host, &x, mode.gelu()));
        }
        let shape = format!("{} layers, hidden {}, {} heads, ffn {}, batch {batch} × seq {}, unfused + fused", dims.layers, dims.hidden, dims.heads, dims.ffn, dims.seq);
        Ok(Report::new(shape, &outs, &refs, TOLERANCE))
    }

    /// Example runner: two layers of BERT-base at batch 1 on a GPU, [`TINY`] at batch 2 on the emulator.
    pub fn run(gpu: &Gpu) -> Result<Report> {
        let (dims, batch) = shape(gpu, (Dims { layers: 2, ..BERT_BASE }, 1), (TINY, 2));
        check(gpu, dims, batch).map_err(|err| match err {
            GemmError::Launch(err) => err,
            GemmError::Shape(what) => unreachable!("the example's shapes are supported: {what}"),
        })
    }
}
