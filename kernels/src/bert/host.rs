//! BERT-base on the host: shapes, random weights, the f64 reference, the model's buffers and
//! its fused and unfused forward passes.

use super::*;
use crate::norms::{self as fused_norms, add_bias, add_residual, gelu_kernel, layer_norm, row_config};
use crate::gemm::{self, gemm_f16, gemm_f16_bias, gemm_f16_bias_gelu, gemm_f16_residual, GemmError};
use crate::softmax::softmax;
use crate::wgmma_gemm::{self, wgmma_f16, wgmma_f16_bias, wgmma_f16_bias_gelu, wgmma_f16_residual};
use crate::wgmma_gemm::{layer_norm_rows, wgmma_split_f16_bias, SmLayout};
use crate::wgmma_gemm::{wgmma_split_f16_folded_ln_bias, wgmma_split_f16_folded_ln_bias_gelu, wgmma_split_f16_ln_residual_stats, wgmma_split_f16_residual_stats};
use clusterfuse::host::{Buffer, Gpu, Result, Stream, Swizzle, TensorMap};
use clusterfuse::Dim3;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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
    pub fn random(d: &Dims, rng: &mut impl Rng) -> Self {
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
    }
}

/// The tensor map of the QKV projection's `tokens × 3 hidden` output in
/// [`fn@attention_split`]'s boxes: [`BOX_TOKENS`] tokens × one head's 64 columns, 128-byte
/// swizzle.
pub fn qkv_map<'a>(gpu: &Gpu, qkv: &'a Buffer<f16>, shape: (usize, usize)) -> Result<TensorMap<'a>> {
    gpu.tensor_map_2d(qkv, shape, (BOX_TOKENS as u32, HEAD_DIM as u32), Swizzle::B128)
}

/// A matrix on a device and its tensor map in the wgmma GEMM's (or the attention's) boxes,
/// owned together.
/// Nothing in this module reassigns `buffer` once the map is made (kernels only write
/// into it), so the address the map holds is that of a live allocation while it exists.
struct Mapped {
    buffer: Buffer<f16>,
    map: TensorMap<'static>,
}

/// [`wgmma_gemm::a_map`], [`wgmma_gemm::bt_map`] or [`qkv_map`].
type MapFn = for<'a> fn(&Gpu, &'a Buffer<f16>, (usize, usize)) -> Result<TensorMap<'a>>;

impl Mapped {
    /// `buffer`, a `rows × cols` matrix, with its map made by `map`.
    fn new(gpu: &Gpu, buffer: Buffer<f16>, shape: (usize, usize), map: MapFn) -> Result<Self> {
        let map = map(gpu, &buffer, shape)?;
        // SAFETY: the map lives in the same `Mapped` as the buffer it describes, whose
        // allocation is never replaced (see the struct); dropping both drops the map too.
        let map = unsafe { map.detach() };
        Ok(Self { buffer, map })
    }
}

/// A projection's weight on a device: `in × out` for the `mma.sync` GEMM, and `out × in`
/// (Bᵀ, as `nn.Linear` stores it) with its tensor maps for the `wgmma` GEMMs (`split`:
/// in the split-K kernels' boxes).
struct Weight {
    w: Buffer<f16>,
    wt: Mapped,
    split: TensorMap<'static>,
}

impl Weight {
    fn upload(gpu: &Gpu, w: &[f16], out: usize) -> Result<Self> {
        let fan_in = w.len() / out;
        let wt = gpu.upload(&wgmma_gemm::transpose(w, fan_in, out))?;
        let wt = Mapped::new(gpu, wt, (out, fan_in), wgmma_gemm::bt_map::<f16>)?;
        // SAFETY: as `Mapped`'s map: `wt.buffer` lives in the same `Weight` and is never
        // replaced.
        let split = unsafe { wgmma_gemm::split_bt_map(gpu, &wt.buffer, (out, fan_in))?.detach() };
        Ok(Self { w: gpu.upload(w)?, wt, split })
    }
}

/// A projection with the LayerNorm before it folded in ([`wgmma_gemm::fold_layer_norm`]):
/// W′ in the split-K kernels' boxes, c and d.
struct Folded {
    w: Mapped,
    c: Buffer<f32>,
    d: Buffer<f32>,
}

impl Folded {
    /// `w` (`in × out`) with `bias`, after the LayerNorm (γ, β).
    fn upload(gpu: &Gpu, w: &[f16], bias: &[f16], (gamma, beta): (&[f16], &[f16])) -> Result<Self> {
        let (fan_in, out) = (gamma.len(), bias.len());
        let (w, c, d) = wgmma_gemm::fold_layer_norm(w, (fan_in, out), bias, gamma, beta);
        let wt = gpu.upload(&wgmma_gemm::transpose(&w, fan_in, out))?;
        Ok(Self { w: Mapped::new(gpu, wt, (out, fan_in), wgmma_gemm::split_bt_map::<f16>)?, c: gpu.upload(&c)?, d: gpu.upload(&d)? })
    }
}

/// One layer's weights on a device, as [`HostLayer`], and for the deferred LayerNorms
/// ([`DeferredNorms`]) its QKV projection with the previous layer's second LayerNorm folded
/// in (none for the first layer) and its FFN1 with its own first one.
pub struct Layer {
    wqkv: Weight,
    bqkv: Buffer<f16>,
    wo: Weight,
    bo: Buffer<f16>,
    gamma1: Buffer<f16>,
    beta1: Buffer<f16>,
    w1: Weight,
    b1: Buffer<f16>,
    w2: Weight,
    b2: Buffer<f16>,
    gamma2: Buffer<f16>,
    beta2: Buffer<f16>,
    qkv_folded: Option<Folded>,
    up_folded: Folded,
}

impl Layer {
    /// `l`, after the layer `previous` (none for the first).
    pub fn upload(gpu: &Gpu, l: &HostLayer, previous: Option<&HostLayer>) -> Result<Self> {
        Ok(Self {
            qkv_folded: previous.map(|p| Folded::upload(gpu, &l.wqkv, &l.bqkv, (&p.gamma2, &p.beta2))).transpose()?,
            up_folded: Folded::upload(gpu, &l.w1, &l.b1, (&l.gamma1, &l.beta1))?,
            wqkv: Weight::upload(gpu, &l.wqkv, l.bqkv.len())?,
            bqkv: gpu.upload(&l.bqkv)?,
            wo: Weight::upload(gpu, &l.wo, l.bo.len())?,
            bo: gpu.upload(&l.bo)?,
            gamma1: gpu.upload(&l.gamma1)?,
            beta1: gpu.upload(&l.beta1)?,
            w1: Weight::upload(gpu, &l.w1, l.b1.len())?,
            b1: gpu.upload(&l.b1)?,
            w2: Weight::upload(gpu, &l.w2, l.b2.len())?,
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
    /// Epilogues, fused attention, bias + LayerNorm; every kernel launched
    /// programmatically after the previous one.
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

    /// Kernel launches per layer, unless the fused mode defers its LayerNorms to the
    /// kernels after them ([`Batch::kernels`]).
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
    wgmma: wgmma_f16::Kernel,
    wgmma_bias: wgmma_f16_bias::Kernel,
    wgmma_bias_gelu: wgmma_f16_bias_gelu::Kernel,
    wgmma_residual: wgmma_f16_residual::Kernel,
    split_bias: wgmma_split_f16_bias::Kernel,
    split_folded: wgmma_split_f16_folded_ln_bias::Kernel,
    split_folded_gelu: wgmma_split_f16_folded_ln_bias_gelu::Kernel,
    split_residual_stats: wgmma_split_f16_residual_stats::Kernel,
    split_ln_residual_stats: wgmma_split_f16_ln_residual_stats::Kernel,
    layer_norm_rows: layer_norm_rows::Kernel,
    add_bias: add_bias::Kernel,
    add_residual: add_residual::Kernel,
    layer_norm: layer_norm::Kernel,
    gelu: gelu_kernel::Kernel,
    scores: attention_scores::Kernel,
    softmax: softmax::Kernel,
    context: attention_context::Kernel,
    attention: attention::Kernel,
    attention_split: attention_split::Kernel,
    bias_layer_norm: bias_layer_norm::Kernel,
}

impl Kernels {
    pub fn load(gpu: &Gpu) -> Result<Self> {
        Ok(Self {
            gemm: gemm_f16::load(gpu)?,
            gemm_bias: gemm_f16_bias::load(gpu)?,
            gemm_bias_gelu: gemm_f16_bias_gelu::load(gpu)?,
            gemm_residual: gemm_f16_residual::load(gpu)?,
            wgmma: wgmma_f16::load(gpu)?,
            wgmma_bias: wgmma_f16_bias::load(gpu)?,
            wgmma_bias_gelu: wgmma_f16_bias_gelu::load(gpu)?,
            wgmma_residual: wgmma_f16_residual::load(gpu)?,
            split_bias: wgmma_split_f16_bias::load(gpu)?,
            split_folded: wgmma_split_f16_folded_ln_bias::load(gpu)?,
            split_folded_gelu: wgmma_split_f16_folded_ln_bias_gelu::load(gpu)?,
            split_residual_stats: wgmma_split_f16_residual_stats::load(gpu)?,
            split_ln_residual_stats: wgmma_split_f16_ln_residual_stats::load(gpu)?,
            layer_norm_rows: layer_norm_rows::load(gpu)?,
            add_bias: add_bias::load(gpu)?,
            add_residual: add_residual::load(gpu)?,
            layer_norm: layer_norm::load(gpu)?,
            gelu: gelu_kernel::load(gpu)?,
            scores: attention_scores::load(gpu)?,
            softmax: softmax::load(gpu)?,
            context: attention_context::load(gpu)?,
            attention: attention::load(gpu)?,
            attention_split: attention_split::load(gpu)?,
            bias_layer_norm: bias_layer_norm::load(gpu)?,
        })
    }

    /// `out = epilogue(a · w)`, M × N × K, on the GEMM `gemm` picked.
    #[allow(clippy::too_many_arguments)]
    fn project(&self, s: &Stream, gemm: &Gemm, epilogue: Epilogue, a: &Mapped, w: &Weight, out: &mut Buffer<f16>, (m, n, k): (u32, u32, u32)) -> Result<()> {
        let (x, wt) = (&a.buffer, &w.wt.map);
        match (gemm, epilogue) {
            (Gemm::Mma(c), Epilogue::None) => self.gemm.launch(s, c, x, &w.w, out, m, n, k),
            (Gemm::Mma(c), Epilogue::Bias(b)) => self.gemm_bias.launch(s, c, x, &w.w, b, out, m, n, k),
            (Gemm::Mma(c), Epilogue::BiasGelu(b)) => self.gemm_bias_gelu.launch(s, c, x, &w.w, b, out, m, n, k),
            (Gemm::Mma(c), Epilogue::Residual(r)) => self.gemm_residual.launch(s, c, x, &w.w, r, out, m, n, k),
            (Gemm::Wgmma(c), Epilogue::None) => self.wgmma.launch(s, c, a.map.words(), wt.words(), out, m, n, k),
            (Gemm::Wgmma(c), Epilogue::Bias(b)) => self.wgmma_bias.launch(s, c, a.map.words(), wt.words(), b, out, m, n, k),
            (Gemm::Wgmma(c), Epilogue::BiasGelu(b)) => self.wgmma_bias_gelu.launch(s, c, a.map.words(), wt.words(), b, out, m, n, k),
            (Gemm::Wgmma(c), Epilogue::Residual(r)) => self.wgmma_residual.launch(s, c, a.map.words(), wt.words(), r, out, m, n, k),
            (Gemm::Split(_), _) => unreachable!("the split-K projections run before a LayerNorm (project_norm) or in forward_deferred"),
        }
    }

    /// `out = LayerNorm(a · w + bias + residual)·γ + β` on the GEMM `gemm` picked, through
    /// `summed`: a split-K `gemm` writes the sum with its rows' statistics into `stats` and
    /// `layer_norm_rows` (`norm_rows`) normalises it; the others add the residual and
    /// `bias_layer_norm` (`rows`) adds the bias and normalises. Both launched as configured.
    #[allow(clippy::too_many_arguments)]
    fn project_norm(
        &self,
        s: &Stream,
        gemm: &Gemm,
        a: &Mapped,
        w: &Weight,
        norm: AddNorm,
        stats: Option<&mut Buffer<f32>>,
        (rows, norm_rows): (&LaunchConfig, &LaunchConfig),
        summed: &mut Buffer<f16>,
        out: &mut Buffer<f16>,
        (m, n, k): (u32, u32, u32),
    ) -> Result<()> {
        let AddNorm { bias, residual, gamma, beta } = norm;
        match (gemm, stats) {
            (Gemm::Split(c), Some(stats)) => {
                self.split_residual_stats.launch(s, c, a.map.words(), w.split.words(), bias, residual, summed, stats, m, n, k)?;
                self.layer_norm_rows.launch(s, norm_rows, summed, stats, gamma, beta, out)
            }
            (Gemm::Split(_), None) => unreachable!("a split-K projection before a LayerNorm comes with its rows' statistics"),
            (gemm, _) => {
                self.project(s, gemm, Epilogue::Residual(residual), a, w, summed, (m, n, k))?;
                self.bias_layer_norm.launch(s, rows, summed, bias, gamma, beta, out, n)
            }
        }
    }
}

/// The LayerNorm after a projection: `LayerNorm(a · w + bias + residual)·γ + β`.
#[derive(Clone, Copy)]
struct AddNorm<'a> {
    bias: &'a Buffer<f16>,
    residual: &'a Buffer<f16>,
    gamma: &'a Buffer<f16>,
    beta: &'a Buffer<f16>,
}

/// What a projection adds to `a · w`.
#[derive(Clone, Copy)]
enum Epilogue<'a> {
    None,
    Bias(&'a Buffer<f16>),
    BiasGelu(&'a Buffer<f16>),
    Residual(&'a Buffer<f16>),
}

/// The emulator stands for a GPU of 8 SMs in [`Projections::pick`], so that [`TINY`] at
/// batch 2 (M = 160) runs its QKV and FFN1 projections on the wgmma GEMM and the others on
/// the `mma.sync` one in the unfused mode and on the split-K `wgmma` kernels in the fused mode,
/// as BERT-base at batch 8 and 16 on the H200, while at batch 1 the fused mode takes the
/// split-K kernels for all four projections and defers its LayerNorms
/// ([`DeferredNorms`]), as BERT-base at batch 1-4 ([`Batch::for_layout`] plans for other
/// layouts).
pub const EMULATOR_SMS: usize = 8;

/// The most blocks a split-K projection splits K over: 6, measured against 5, 7 and 8 on
/// the H200 at batch 1 (`results/bert-h200.md`, session 16). It binds O and FFN2 (12
/// column tiles), whose f16 partials 6 blocks exchange in less time than 8 save in
/// k-steps (the pass 365.4 µs against 371.7 at 8; 5, uneven k-steps, 388). Below it
/// `wgmma_gemm::split_k_config` picks each projection's splits by the waves of clusters
/// the GPU holds: on the H200 QKV 3 and FFN1 2 at batch 1, unsplit from batch 2; O and
/// FFN2 4 at batch 2 (5 took two waves: 22 clusters of 5 fit), 2 at batch 4, 1 at batch
/// 8 and O 1, FFN2 2 at batch 16.
pub const SPLIT_K_SPLITS: usize = 6;

/// A projection's GEMM and its launch configuration.
#[derive(Clone, Copy)]
enum Gemm {
    /// The `mma.sync` GEMM ([`crate::gemm`]), splitting K over a cluster at small M.
    Mma(LaunchConfig),
    /// The `wgmma` GEMM ([`crate::wgmma_gemm`]), persistent over 128 × 256 tiles.
    Wgmma(LaunchConfig),
    /// The split-K `wgmma` GEMM: 128 × 64 tiles, K split over a cluster.
    Split(LaunchConfig),
}

impl Gemm {
    /// Whether the `wgmma` GEMM takes M × N on `sms` SMs: once its 128 × 256
    /// tiles, each worth two SMs of the `mma.sync` GEMM's, cover the SMs (2 · tiles ≥ SMs).
    /// The `wgmma` GEMM runs ~2× the work of the `mma.sync` one's per SM (`results/gemm-h200.md`:
    /// 2.0-2.4× at BERT's shapes), but one block per tile and never splits K; example
    /// 10's splits K across up to 8 blocks while its tiles leave SMs idle. BERT-base on
    /// 132 SMs: QKV and FFN1 from batch 8, O and FFN2 from batch 32.
    fn wgmma_covers(m: usize, n: usize, sms: usize) -> bool {
        2 * m.div_ceil(wgmma_gemm::BM) * n.div_ceil(wgmma_gemm::BN) >= sms
    }

    /// The faster GEMM for M × N × K on `sms` SMs, alone: the `wgmma` GEMM where
    /// it covers the SMs ([`Gemm::wgmma_covers`]), else the split-K `mma.sync` GEMM.
    fn pick(m: usize, n: usize, k: usize, sms: usize) -> std::result::Result<Self, GemmError> {
        if Self::wgmma_covers(m, n, sms) {
            Ok(Self::Wgmma(wgmma_gemm::config(m, n, k, sms)?))
        } else {
            Ok(Self::Mma(gemm::config(m, n, k)?))
        }
    }

    /// The same, launched programmatically after the previous kernel.
    fn programmatic(self) -> Self {
        match self {
            Self::Mma(c) => Self::Mma(programmatic(c)),
            Self::Wgmma(c) => Self::Wgmma(programmatic(c)),
            Self::Split(c) => Self::Split(programmatic(c)),
        }
    }
}

/// The GEMMs of a layer's four projections in one mode.
#[derive(Clone, Copy)]
struct Projections {
    qkv: Gemm,
    o: Gemm,
    up: Gemm,
    down: Gemm,
}

impl Projections {
    /// The GEMMs for `tokens` rows of `dims` in `mode`: [`Gemm::pick`]'s, except that the
    /// fused mode, where no projection takes the `wgmma` GEMM, takes the split-K `wgmma`
    /// kernels for all four (128 × 64 tiles, K split over a cluster of up to
    /// [`SPLIT_K_SPLITS`] blocks where the SMs allow), so that its LayerNorms are
    /// deferred ([`DeferredNorms`]): BERT-base on 132 SMs at batch 1-4, each projection
    /// on 72-192 blocks. Against the `mma.sync` GEMMs and separate LayerNorms (7 kernels a
    /// layer), the H200 ran the batch-2 and batch-4 passes in 640-646 and 838-842 µs
    /// against 833.5-833.9 and 1115.5-1115.8; taken at batch 8, 16 and 32 too, where QKV
    /// and FFN1 would take the `wgmma` GEMM, they lost (1308-1311, 2410-2413 and 4340-4344
    /// µs against 1178, 1935-1938 and 2197-2206; `results/bert-h200.md`, session 18).
    /// There the fused mode takes the split-K kernels for O and FFN2 alone, wherever the
    /// `wgmma` GEMM does not cover the SMs for them (BERT-base at batch 8 and 16: 96 and 192
    /// tiles of 128 × 64), instead of the `mma.sync` GEMM's: the passes took 1037-1046 and 1744-1754
    /// µs against 1181-1183 and 1946 (session 19, call 1, K unsplit); at batch 32, where
    /// the `wgmma` GEMM covers them, 2731 against its 2202-2207.
    fn pick(mode: Mode, dims: &Dims, tokens: usize, layout: &SmLayout) -> std::result::Result<Self, GemmError> {
        let (h, f, sms) = (dims.hidden, dims.ffn, layout.sms());
        // N, K and whether a LayerNorm reads the output.
        let shapes = [(3 * h, h, false), (h, h, true), (f, h, false), (h, f, true)];
        let stats = mode == Mode::Fused && h <= wgmma_gemm::NORM_MAX_N;
        let split = stats && !shapes.iter().any(|&(n, _, _)| Gemm::wgmma_covers(tokens, n, sms));
        let [qkv, o, up, down] = shapes.map(|(n, k, normed)| {
            if split || (stats && normed && !Gemm::wgmma_covers(tokens, n, sms)) {
                Ok(Gemm::Split(wgmma_gemm::split_k_config(tokens, n, k, layout, SPLIT_K_SPLITS)?))
            } else {
                Gemm::pick(tokens, n, k, sms)
            }
        });
        Ok(Self { qkv: qkv?, o: o?, up: up?, down: down? })
    }

    /// Whether all four projections take the split-K kernels.
    fn split(&self) -> bool {
        [self.qkv, self.o, self.up, self.down].iter().all(|g| matches!(g, Gemm::Split(_)))
    }

    /// Whether O and FFN2 take the split-K kernels (both or neither: the same N).
    fn split_before_norms(&self) -> bool {
        matches!(self.o, Gemm::Split(_))
    }
}

/// `config` with programmatic dependent launch.
fn programmatic(config: LaunchConfig) -> LaunchConfig {
    LaunchConfig { programmatic: true, ..config }
}

/// A model: its sizes and its layers' weights, on the host and on a device.
pub struct Model {
    pub dims: Dims,
    pub host: Vec<HostLayer>,
    layers: Vec<Layer>,
}

impl Model {
    /// Random weights for `dims.layers` layers, drawn from `seed`, uploaded to `gpu`.
    pub fn random(gpu: &Gpu, dims: Dims, seed: u64) -> Result<Self> {
        let mut rng = StdRng::seed_from_u64(seed);
        let host: Vec<HostLayer> = (0..dims.layers).map(|_| HostLayer::random(&dims, &mut rng)).collect();
        let layers = host.iter().enumerate().map(|(i, l)| Layer::upload(gpu, l, i.checked_sub(1).map(|p| &host[p]))).collect::<Result<_>>()?;
        Ok(Self { dims, host, layers })
    }
}

/// One batch size's activations (all poisoned with NaN until written), with the tensor
/// maps of those that projections read, and launch configurations. `x` holds the input
/// and, after a forward pass, the output.
pub struct Batch {
    pub tokens: usize,
    x: Mapped,
    h1: Mapped,
    ctx: Mapped,
    proj: Buffer<f16>,
    biased: Buffer<f16>,
    summed: Buffer<f16>,
    qkv_raw: Buffer<f16>,
    qkv: Mapped,
    up_raw: Buffer<f16>,
    up_biased: Buffer<f16>,
    up: Mapped,
    scores: Buffer<f32>,
    probs: Buffer<f32>,
    /// The projections' GEMMs, per mode (`Mode::ALL`'s order).
    gemms: [Projections; 2],
    rows: LaunchConfig,
    rows_qkv: LaunchConfig,
    rows_up: LaunchConfig,
    attention: LaunchConfig,
    /// The fused mode's LayerNorms deferred to the kernels that read their outputs, where
    /// all four projections take the split-K kernels (BERT-base: batch 1-4), else `None`.
    deferred: Option<DeferredNorms>,
    /// The rows' statistics that the fused mode's split-K O and FFN2 kernels write with
    /// their LayerNorms' inputs (after O `[0]`, after FFN2 `[1]`; `hidden / 64` pairs a
    /// row), where it takes them (BERT-base: batch 1-16), else `None`.
    stats: Option<[Buffer<f32>; 2]>,
    /// `layer_norm_rows`: 8 rows a block.
    norm_rows: LaunchConfig,
    /// The deferred fused mode's attention: [`attention_split`]'s grid, where the LayerNorms
    /// are deferred (4× the blocks of [`attention`]: at batch 2 and 4 the H200 ran the
    /// pass in 642-646 and 841-842 µs with it, 666-668 and 859 with [`attention`] (call 3),
    /// `results/bert-h200.md`), else `None`.
    attention_split: Option<LaunchConfig>,
    softmax: LaunchConfig,
}

/// A post-LN layer's two LayerNorms, deferred: the O and FFN2 projections write their
/// inputs (`summed`, the rows' statistics in `stats`: `wgmma_split_f16_*residual_stats`)
/// and every kernel that reads an output takes the LayerNorm on the fly (QKV and FFN1 fold
/// it into their product, [`wgmma_gemm::FoldedNorm`]; O and FFN2 take it of their residual,
/// [`wgmma_gemm::RowNorm`]), so that no kernel waits
/// for another cluster's columns of a row; `layer_norm_rows` writes the last layer's
/// output. 5 kernels a layer and one a pass, none of them a LayerNorm.
struct DeferredNorms {
    /// The inputs of the LayerNorms after O (`[0]`) and after FFN2 (`[1]`), `tokens × hidden`.
    summed: [Mapped; 2],
}

impl Batch {
    /// Buffers for `batch` sequences of `dims`, with the input `x` (`tokens × hidden`),
    /// picking the GEMMs for this GPU ([`SmLayout::planned`]; the emulator: [`EMULATOR_SMS`]).
    pub fn new(gpu: &Gpu, dims: &Dims, batch: usize, x: &[f16]) -> std::result::Result<Self, GemmError> {
        Self::for_layout(gpu, dims, batch, x, &SmLayout::planned(gpu, EMULATOR_SMS)?)
    }

    /// As [`Batch::new`], picking the GEMMs for a GPU of `layout`.
    pub fn for_layout(gpu: &Gpu, dims: &Dims, batch: usize, x: &[f16], layout: &SmLayout) -> std::result::Result<Self, GemmError> {
        dims.check().map_err(GemmError::Shape)?;
        let (tokens, h, f) = (batch * dims.seq, dims.hidden, dims.ffn);
        if x.len() != tokens * h {
            return Err(GemmError::Shape(format!("the input holds {} values; batch {batch} × seq {} × hidden {h} is {}", x.len(), dims.seq, tokens * h)));
        }
        let poisoned = |len: usize| gpu.upload(&vec![f16::NAN; len]);
        let mapped = |buffer: Result<Buffer<f16>>, cols: usize| Mapped::new(gpu, buffer?, (tokens, cols), wgmma_gemm::a_map::<f16>);
        let rows = (tokens * dims.heads) as u32;
        let fused = Projections::pick(Mode::Fused, dims, tokens, layout)?;
        let split = fused.split();
        let deferred = if split {
            let summed = || mapped(poisoned(tokens * h), h);
            Some(DeferredNorms { summed: [summed()?, summed()?] })
        } else {
            None
        };
        let stats = if fused.split_before_norms() {
            let stats = || gpu.upload(&vec![f32::NAN; 2 * tokens * (h / wgmma_gemm::SPLIT_BN)]);
            Some([stats()?, stats()?])
        } else {
            None
        };
        Ok(Self {
            tokens,
            x: mapped(gpu.upload(x), h)?,
            h1: mapped(poisoned(tokens * h), h)?,
            ctx: mapped(poisoned(tokens * h), h)?,
            proj: poisoned(tokens * h)?,
            biased: poisoned(tokens * h)?,
            summed: poisoned(tokens * h)?,
            qkv_raw: poisoned(tokens * 3 * h)?,
            qkv: Mapped::new(gpu, poisoned(tokens * 3 * h)?, (tokens, 3 * h), qkv_map)?,
            up_raw: poisoned(tokens * f)?,
            up_biased: poisoned(tokens * f)?,
            up: mapped(poisoned(tokens * f), f)?,
            scores: gpu.upload(&vec![f32::NAN; rows as usize * dims.seq])?,
            probs: gpu.upload(&vec![f32::NAN; rows as usize * dims.seq])?,
            gemms: [Projections::pick(Mode::Unfused, dims, tokens, layout)?, fused],
            deferred,
            stats,
            norm_rows: LaunchConfig { grid: (tokens.div_ceil(8) as u32).into(), block: 256.into(), ..LaunchConfig::default() },
            rows: row_config(h as u32, tokens as u32),
            rows_qkv: row_config(3 * h as u32, tokens as u32),
            rows_up: row_config(f as u32, tokens as u32),
            attention: LaunchConfig {
                grid: Dim3::new(dims.seq.div_ceil(QUERIES_PER_BLOCK) as u32, dims.heads as u32, batch as u32),
                block: (32 * ATTENTION_WARPS).into(),
                ..LaunchConfig::default()
            },
            attention_split: split.then(|| {
                let grid = Dim3::new(dims.seq.div_ceil(SPLIT_QUERIES) as u32, dims.heads as u32, batch as u32);
                // One block an SM where the grid fits the SMs: batch 1's 96 blocks,
                // launched programmatically while the QKV kernel holds 108 SMs, would
                // otherwise pile onto the SMs it leaves free, three a SM (its shared memory
                // allows), and the batch-1 pass took 443 µs against 421; past one wave,
                // uncapped (batch 2 and 4: 642-646 and 841-842 µs against 659 and 888
                // capped; `results/bert-h200.md`).
                let blocks = (grid.x * grid.y * grid.z) as usize;
                LaunchConfig { grid, block: (32 * ATTENTION_WARPS).into(), max_blocks_per_sm: (blocks <= layout.sms()).then_some(1), ..LaunchConfig::default() }
            }),
            // Example 04's softmax: a warp per row, 8 rows a block.
            softmax: LaunchConfig { grid: rows.div_ceil(8).into(), block: 256.into(), ..LaunchConfig::default() },
        })
    }

    /// Launches every layer of `model` on `s`, in `mode`: `x` becomes the encoder's output.
    pub fn forward(&mut self, s: &Stream, k: &Kernels, model: &Model, mode: Mode) -> Result<()> {
        let d = &model.dims;
        let (t, h, f, seq, heads) = (self.tokens as u32, d.hidden as u32, d.ffn as u32, d.seq as u32, d.heads as u32);
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        if mode == Mode::Fused && self.deferred.is_some() {
            return self.forward_deferred(s, k, model);
        }
        let g = self.gemms[mode as usize];
        for l in &model.layers {
            match mode {
                Mode::Unfused => {
                    k.project(s, &g.qkv, Epilogue::None, &self.x, &l.wqkv, &mut self.qkv_raw, (t, 3 * h, h))?;
                    k.add_bias.launch(s, &self.rows_qkv, &self.qkv_raw, &l.bqkv, &mut self.qkv.buffer)?;
                    k.scores.launch(s, &self.attention, &self.qkv.buffer, &mut self.scores, seq, heads, scale)?;
                    k.softmax.launch(s, &self.softmax, &self.scores, &mut self.probs, seq)?;
                    k.context.launch(s, &self.attention, &self.probs, &self.qkv.buffer, &mut self.ctx.buffer, seq, heads)?;
                    k.project(s, &g.o, Epilogue::None, &self.ctx, &l.wo, &mut self.proj, (t, h, h))?;
                    k.add_bias.launch(s, &self.rows, &self.proj, &l.bo, &mut self.biased)?;
                    k.add_residual.launch(s, &self.rows, &self.biased, &self.x.buffer, &mut self.summed)?;
                    k.layer_norm.launch(s, &self.rows, &self.summed, &l.gamma1, &l.beta1, &mut self.h1.buffer, h)?;
                    k.project(s, &g.up, Epilogue::None, &self.h1, &l.w1, &mut self.up_raw, (t, f, h))?;
                    k.add_bias.launch(s, &self.rows_up, &self.up_raw, &l.b1, &mut self.up_biased)?;
                    k.gelu.launch(s, &self.rows_up, &self.up_biased, &mut self.up.buffer)?;
                    k.project(s, &g.down, Epilogue::None, &self.up, &l.w2, &mut self.proj, (t, h, f))?;
                    k.add_bias.launch(s, &self.rows, &self.proj, &l.b2, &mut self.biased)?;
                    k.add_residual.launch(s, &self.rows, &self.biased, &self.h1.buffer, &mut self.summed)?;
                    k.layer_norm.launch(s, &self.rows, &self.summed, &l.gamma2, &l.beta2, &mut self.x.buffer, h)?;
                }
                Mode::Fused => {
                    // Every kernel launched programmatically: it starts while the previous
                    // one finishes, a GEMM's first weight loads in flight, and waits for it
                    // (`grid::wait_for_prerequisites`) before touching activations.
                    let (attention, rows) = (programmatic(self.attention), (&programmatic(self.rows), &programmatic(self.norm_rows)));
                    let (qkv, o, up, down) = (g.qkv.programmatic(), g.o.programmatic(), g.up.programmatic(), g.down.programmatic());
                    let [o_stats, ffn_stats] = match &mut self.stats {
                        Some([o, ffn]) => [Some(o), Some(ffn)],
                        None => [None, None],
                    };
                    k.project(s, &qkv, Epilogue::Bias(&l.bqkv), &self.x, &l.wqkv, &mut self.qkv.buffer, (t, 3 * h, h))?;
                    k.attention.launch(s, &attention, &self.qkv.buffer, &mut self.ctx.buffer, seq, heads, scale)?;
                    let norm = AddNorm { bias: &l.bo, residual: &self.x.buffer, gamma: &l.gamma1, beta: &l.beta1 };
                    k.project_norm(s, &o, &self.ctx, &l.wo, norm, o_stats, rows, &mut self.summed, &mut self.h1.buffer, (t, h, h))?;
                    k.project(s, &up, Epilogue::BiasGelu(&l.b1), &self.h1, &l.w1, &mut self.up.buffer, (t, f, h))?;
                    let norm = AddNorm { bias: &l.b2, residual: &self.h1.buffer, gamma: &l.gamma2, beta: &l.beta2 };
                    k.project_norm(s, &down, &self.up, &l.w2, norm, ffn_stats, rows, &mut self.summed, &mut self.x.buffer, (t, h, f))?;
                }
            }
        }
        Ok(())
    }

    /// The fused mode with its LayerNorms deferred ([`DeferredNorms`]): per layer QKV (of
    /// LayerNorm(A), folded into the product, past the first layer), attention, O + bias + residual (LayerNorm-ed
    /// past the first layer) with its rows' statistics, FFN1 + GELU of LayerNorm(A) (folded), FFN2 +
    /// bias + LayerNorm-ed residual with its rows' statistics; then the last LayerNorm into
    /// `x`. Every kernel launched programmatically.
    fn forward_deferred(&mut self, s: &Stream, k: &Kernels, model: &Model) -> Result<()> {
        let d = &model.dims;
        let (t, h, f, seq, heads) = (self.tokens as u32, d.hidden as u32, d.ffn as u32, d.seq as u32, d.heads as u32);
        let scale = 1.0 / (HEAD_DIM as f32).sqrt();
        let (Some(norms), Some(stats), Some(attention)) = (self.deferred.as_mut(), self.stats.as_mut(), self.attention_split) else {
            unreachable!("the deferred LayerNorms come with the split-K projections and attention_split")
        };
        let config = |gemm: Gemm| match gemm.programmatic() {
            Gemm::Split(c) => c,
            _ => unreachable!("the deferred LayerNorms are taken only with the split-K projections"),
        };
        let g = self.gemms[Mode::Fused as usize];
        let (qkv, o, up, down, attention) = (config(g.qkv), config(g.o), config(g.up), config(g.down), programmatic(attention));
        let ([after_o, after_ffn], [o_stats, ffn_stats]) = (&mut norms.summed, stats);
        for (i, l) in model.layers.iter().enumerate() {
            // The layer's input: x, or the previous layer's output, LayerNorm-ed on the fly.
            let previous = i.checked_sub(1).map(|p| &model.layers[p]);
            match &l.qkv_folded {
                None => k.split_bias.launch(s, &qkv, self.x.map.words(), l.wqkv.split.words(), &l.bqkv, &mut self.qkv.buffer, t, 3 * h, h)?,
                Some(w) => k.split_folded.launch(s, &qkv, after_ffn.map.words(), w.w.map.words(), ffn_stats, &w.c, &w.d, &mut self.qkv.buffer, t, 3 * h, h)?,
            }
            k.attention_split.launch(s, &attention, self.qkv.map.words(), &mut self.ctx.buffer, seq, heads, scale)?;
            let (a, wo) = (self.ctx.map.words(), l.wo.split.words());
            match previous {
                None => k.split_residual_stats.launch(s, &o, a, wo, &l.bo, &self.x.buffer, &mut after_o.buffer, o_stats, t, h, h)?,
                Some(p) => {
                    let residual = &after_ffn.buffer;
                    k.split_ln_residual_stats.launch(s, &o, a, wo, &l.bo, residual, ffn_stats, &p.gamma2, &p.beta2, &mut after_o.buffer, o_stats, t, h, h)?
                }
            }
            let w1 = &l.up_folded;
            k.split_folded_gelu.launch(s, &up, after_o.map.words(), w1.w.map.words(), o_stats, &w1.c, &w1.d, &mut self.up.buffer, t, f, h)?;
            let (a, w2) = (self.up.map.words(), l.w2.split.words());
            k.split_ln_residual_stats.launch(s, &down, a, w2, &l.b2, &after_o.buffer, o_stats, &l.gamma1, &l.beta1, &mut after_ffn.buffer, ffn_stats, t, h, f)?;
        }
        if let Some(last) = model.layers.last() {
            k.layer_norm_rows.launch(s, &programmatic(self.norm_rows), &after_ffn.buffer, ffn_stats, &last.gamma2, &last.beta2, &mut self.x.buffer)?;
        }
        Ok(())
    }

    /// Kernel launches of a forward pass through `layers` layers in `mode`.
    pub fn kernels(&self, mode: Mode, layers: usize) -> usize {
        match (mode, &self.deferred) {
            (Mode::Fused, Some(_)) => 5 * layers + usize::from(layers > 0),
            _ => mode.kernels_per_layer() * layers,
        }
    }

    /// The encoder's input, or after [`Batch::forward`] its output (`tokens × hidden`).
    pub fn x(&self) -> &Buffer<f16> {
        &self.x.buffer
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
