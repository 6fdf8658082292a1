//! A Llama-architecture model decoding one token (batch 1) on a candle device, two ways: in
//! candle's own ops ([`Llama::candle_step`]: matmul, `candle_nn`'s fused RMSNorm, RoPE and
//! softmax, a KV cache written with `slice_set`), and with clusterfuse's fused kernels
//! swapped in ([`Llama::clusterfuse_step`]: 5 ops a layer, 6 launches). The weights are the
//! kernel library's random [`llama::Model`](clusterfuse_kernels::llama::Model), so the
//! library's f64 reference checks both.
//!
//! ```no_run
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device};
//! use clusterfuse_candle::model::{Cache, Llama};
//! use clusterfuse_candle::Kernels;
//! use clusterfuse_kernels::llama::{Model, Shape};
//!
//! let device = Device::Cpu;
//! let model = Model::random(Shape::tiny(), 42, 5, 7).map_err(candle_core::Error::wrap)?; // seed, position, token
//! let llama = Llama::new(&model, &device)?;
//! let (mut ours, mut theirs) = (Cache::new(&model, &device)?, Cache::new(&model, &device)?);
//! let logits = llama.clusterfuse_step(&Kernels::new(&device)?, &mut ours, 7, 5)?;
//! let expected = llama.to_dtype(DType::F32)?.candle_step(&mut theirs, 7, 5)?;
//! # let _ = (logits, expected); Ok(()) }
//! ```

use crate::Kernels;
use candle_core::{bail, DType, Device, Result, Tensor, D};
use candle_nn::ops::{rms_norm, softmax_last_dim};
use candle_nn::rotary_emb::rope;
use clusterfuse_kernels::llama::chain::{EPS, HEAD_DIM};
use clusterfuse_kernels::llama::{Model, Shape};

/// One layer's weights: `(rows, columns)` matrices, as the kernel library lays them out.
pub struct Layer {
    pub norm1: Tensor,
    /// The q heads' rows, then the k heads', then the v heads'.
    pub w_qkv: Tensor,
    pub w_o: Tensor,
    pub norm2: Tensor,
    /// The gate rows, then the up rows.
    pub w_gate_up: Tensor,
    pub w_down: Tensor,
}

/// The model's weights on a candle device, all of one dtype (bf16 as uploaded).
pub struct Llama {
    pub shape: Shape,
    /// `(vocab, hidden)`, also the LM head.
    pub embedding: Tensor,
    pub layers: Vec<Layer>,
    pub final_norm: Tensor,
    /// f32 `(max_len, 64)`: per position 32 cosines then 32 sines (the kernels' table).
    pub rope: Tensor,
    /// `(max_len, 32)` in the weights' dtype: candle's `rope` takes them apart.
    cos: Tensor,
    sin: Tensor,
}

/// Each layer's KV cache: bf16 `(kv_heads, max_len, 64)`, key then value.
pub struct Cache {
    pub k: Vec<Tensor>,
    pub v: Vec<Tensor>,
}

impl Cache {
    /// The caches of `model` (random tokens before its position, NaN from it on) on `device`.
    pub fn new(model: &Model, device: &Device) -> Result<Self> {
        let s = model.shape;
        let upload = |c: &Vec<clusterfuse::bf16>| Tensor::from_slice(c, (s.kv_heads, s.max_len, HEAD_DIM), device);
        Ok(Self { k: model.k_cache.iter().map(upload).collect::<Result<_>>()?, v: model.v_cache.iter().map(upload).collect::<Result<_>>()? })
    }
}

/// Relative error `‖a − b‖ / ‖b‖` of two tensors of one shape, in f64.
pub fn relative_error(a: &Tensor, b: &Tensor) -> Result<f64> {
    let (a, b) = (a.to_dtype(DType::F64)?, b.to_dtype(DType::F64)?);
    let norm = |t: &Tensor| -> Result<f64> { t.sqr()?.sum_all()?.sqrt()?.to_scalar::<f64>() };
    Ok(norm(&(a - &b)?)? / norm(&b)?)
}

impl Llama {
    /// Uploads `model`'s weights (bf16) to `device`. Fails for shapes the kernels do not
    /// support ([`Shape::check`]).
    pub fn new(model: &Model, device: &Device) -> Result<Self> {
        let s = model.shape;
        s.check().map_err(candle_core::Error::wrap)?;
        let (h, i) = (s.hidden, s.inter);
        let matrix = |w: &Vec<clusterfuse::bf16>, rows: usize, cols: usize| Tensor::from_slice(w, (rows, cols), device);
        let layers = model
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    norm1: Tensor::from_slice(&l.norm1, h, device)?,
                    w_qkv: matrix(&l.w_qkv, s.qkv_rows(), h)?,
                    w_o: matrix(&l.w_o, h, h)?,
                    norm2: Tensor::from_slice(&l.norm2, h, device)?,
                    w_gate_up: matrix(&l.w_gate_up, 2 * i, h)?,
                    w_down: matrix(&l.w_down, h, i)?,
                })
            })
            .collect::<Result<_>>()?;
        let rope = Tensor::from_slice(&model.rope, (s.max_len, HEAD_DIM), device)?;
        let [cos, sin] = rope_factors(&rope, DType::BF16)?;
        Ok(Self { shape: s, embedding: matrix(&model.embedding, s.vocab, h)?, layers, final_norm: Tensor::from_slice(&model.final_norm, h, device)?, rope, cos, sin })
    }

    /// The same model with weights (and candle's RoPE factors) in `dtype`: for
    /// [`Llama::candle_step`] in f32, the reference the kernels are checked against.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self> {
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    norm1: l.norm1.to_dtype(dtype)?,
                    w_qkv: l.w_qkv.to_dtype(dtype)?,
                    w_o: l.w_o.to_dtype(dtype)?,
                    norm2: l.norm2.to_dtype(dtype)?,
                    w_gate_up: l.w_gate_up.to_dtype(dtype)?,
                    w_down: l.w_down.to_dtype(dtype)?,
                })
            })
            .collect::<Result<_>>()?;
        let [cos, sin] = rope_factors(&self.rope, dtype)?;
        Ok(Self { shape: self.shape, embedding: self.embedding.to_dtype(dtype)?, layers, final_norm: self.final_norm.to_dtype(dtype)?, rope: self.rope.clone(), cos, sin })
    }

    /// One decode step in candle's ops, activations in the weights' dtype: the logits (f32,
    /// `vocab`) for `token` at `position`, k and v appended to `cache`.
    pub fn candle_step(&self, cache: &mut Cache, token: u32, position: usize) -> Result<Tensor> {
        let mut x = self.embedding.narrow(0, token as usize, 1)?;
        for (l, layer) in self.layers.iter().enumerate() {
            let attn = self.candle_attention(&x, layer, &cache.k[l], &cache.v[l], position)?;
            x = (x + attn.matmul(&layer.w_o.t()?)?)?;
            let act = candle_gate_up(&x, &layer.norm2, &layer.w_gate_up)?;
            x = (x + act.matmul(&layer.w_down.t()?)?)?;
        }
        rms_norm(&x, &self.final_norm, EPS)?.matmul(&self.embedding.t()?)?.to_dtype(DType::F32)?.flatten_all()
    }

    /// [`Kernels::attention`] in candle's ops: `x` `(1, hidden)` in the weights' dtype; returns
    /// the heads' outputs `(1, hidden)`.
    pub fn candle_attention(&self, x: &Tensor, layer: &Layer, k_cache: &Tensor, v_cache: &Tensor, position: usize) -> Result<Tensor> {
        let s = self.shape;
        let (dtype, kv_rows, group) = (x.dtype(), s.kv_rows(), s.heads / s.kv_heads);
        let qkv = rms_norm(x, &layer.norm1, EPS)?.matmul(&layer.w_qkv.t()?)?;
        let heads = |start: usize, n: usize| qkv.narrow(1, start, n * HEAD_DIM)?.reshape((1, n, 1, HEAD_DIM))?.contiguous();
        let (cos, sin) = (self.cos.narrow(0, position, 1)?, self.sin.narrow(0, position, 1)?);
        let q = rope(&heads(0, s.heads)?, &cos, &sin)?;
        let k = rope(&heads(s.hidden, s.kv_heads)?, &cos, &sin)?;
        let v = heads(s.hidden + kv_rows, s.kv_heads)?;
        for (cache, new) in [(k_cache, &k), (v_cache, &v)] {
            cache.slice_set(&new.reshape((s.kv_heads, 1, HEAD_DIM))?.to_dtype(DType::BF16)?, 1, position)?;
        }
        let cached = |cache: &Tensor| cache.narrow(1, 0, position + 1)?.to_dtype(dtype)?.contiguous();
        let (keys, values) = (cached(k_cache)?, cached(v_cache)?);
        let q = q.reshape((s.kv_heads, group, HEAD_DIM))?;
        let scores = (q.matmul(&keys.t()?)? * (1.0 / (HEAD_DIM as f64).sqrt()))?;
        softmax_last_dim(&scores)?.matmul(&values)?.reshape((1, s.hidden))
    }

    /// One decode step with clusterfuse's kernels (weights in bf16): the logits (f32,
    /// `vocab`) for `token` at `position`, k and v appended to `cache`. The embedding row is
    /// taken and widened by candle's ops; then per layer [`Kernels::attention`],
    /// [`Kernels::residual`], [`Kernels::gate_up`], [`Kernels::residual`]; then
    /// [`Kernels::lm_head`].
    pub fn clusterfuse_step(&self, kernels: &Kernels, cache: &mut Cache, token: u32, position: usize) -> Result<Tensor> {
        if position >= self.shape.max_len {
            bail!("position {position} is past the caches ({} tokens)", self.shape.max_len);
        }
        let device = kernels.device();
        let position = Tensor::new(&[position as u32], device)?;
        let h = self.embedding.narrow(0, token as usize, 1)?.to_dtype(DType::F32)?.flatten_all()?;
        for (l, layer) in self.layers.iter().enumerate() {
            let attn = kernels.attention(&h, &layer.norm1, &layer.w_qkv, &self.rope, &position, &cache.k[l], &cache.v[l])?;
            kernels.residual(&h, &layer.w_o, &attn)?;
            let act = kernels.gate_up(&h, &layer.norm2, &layer.w_gate_up)?;
            kernels.residual(&h, &layer.w_down, &act)?;
        }
        kernels.lm_head(&h, &self.final_norm, &self.embedding)
    }
}

/// The cosines and the sines of the kernels' RoPE table, apart, in `dtype` (candle's `rope`).
fn rope_factors(rope: &Tensor, dtype: DType) -> Result<[Tensor; 2]> {
    let half = |start: usize| rope.narrow(1, start, HEAD_DIM / 2)?.contiguous()?.to_dtype(dtype);
    Ok([half(0)?, half(HEAD_DIM / 2)?])
}

/// [`Kernels::gate_up`] in candle's ops: `x` `(1, hidden)`; returns `(1, inter)`.
pub fn candle_gate_up(x: &Tensor, norm_w: &Tensor, w_gate_up: &Tensor) -> Result<Tensor> {
    let gate_up = rms_norm(x, norm_w, EPS)?.matmul(&w_gate_up.t()?)?;
    let inter = gate_up.dim(D::Minus1)? / 2;
    gate_up.narrow(1, 0, inter)?.silu()? * gate_up.narrow(1, inter, inter)?
}

/// Each op of [`Kernels`] against its candle ops in f32 on fresh inputs (random `h` from
/// candle's generator, `model`'s first layer, its caches at `position`): the relative
/// error of the attention output, the appended k and v rows, the residual update, the MLP
/// input and the logits. `llama` is `model` in bf16 as [`Llama::new`] uploads it,
/// `reference` the same in f32 ([`Llama::to_dtype`]).
pub fn op_errors(kernels: &Kernels, model: &Model, llama: &Llama, reference: &Llama, position: usize) -> Result<Vec<(&'static str, f64)>> {
    let (device, s) = (kernels.device(), model.shape);
    let (layer, layer32) = (&llama.layers[0], &reference.layers[0]);
    let (ours, theirs) = (Cache::new(model, device)?, Cache::new(model, device)?);
    let h = Tensor::randn(0f32, 1.0, s.hidden, device)?;
    let x = h.unsqueeze(0)?;
    let attn = kernels.attention(&h, &layer.norm1, &layer.w_qkv, &llama.rope, &Tensor::new(&[position as u32], device)?, &ours.k[0], &ours.v[0])?;
    let expected = reference.candle_attention(&x, layer32, &theirs.k[0], &theirs.v[0], position)?;
    let appended = |c: &Cache| -> Result<Tensor> { Tensor::cat(&[c.k[0].narrow(1, position, 1)?, c.v[0].narrow(1, position, 1)?], 0) };
    let updated = h.copy()?;
    kernels.residual(&updated, &layer.w_o, &attn)?;
    Ok(vec![
        ("attention", relative_error(&attn, &expected.flatten_all()?)?),
        ("appended k, v", relative_error(&appended(&ours)?, &appended(&theirs)?)?),
        ("residual (W_o)", relative_error(&updated, &(&x + attn.unsqueeze(0)?.matmul(&layer32.w_o.t()?)?)?.flatten_all()?)?),
        ("gate_up", relative_error(&kernels.gate_up(&h, &layer.norm2, &layer.w_gate_up)?, &candle_gate_up(&x, &layer32.norm2, &layer32.w_gate_up)?.flatten_all()?)?),
        ("lm_head", relative_error(&kernels.lm_head(&h, &llama.final_norm, &llama.embedding)?, &rms_norm(&x, &reference.final_norm, EPS)?.matmul(&reference.embedding.t()?)?.flatten_all()?)?),
    ])
}
