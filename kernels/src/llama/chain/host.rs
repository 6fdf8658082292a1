//! The model on the host: shapes, random weights, the f64 reference of one step, device
//! buffers, and the step's 82 launches.

use super::*;
use crate::uniform;
use clusterfuse::host::{Buffer, Error, Gpu, Result, Stream};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

/// A Llama-shaped model's dimensions.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub inter: usize,
    pub vocab: usize,
    /// Tokens each layer's cache holds.
    pub max_len: usize,
}

impl Shape {
    /// Llama-3.2-1B, with caches of `max_len` tokens.
    pub fn llama_3_2_1b(max_len: usize) -> Self {
        Self { layers: 16, hidden: 2048, heads: 32, kv_heads: 8, inter: 8192, vocab: 128_256, max_len }
    }

    /// The emulator's: 2 layers, hidden 256, 4 query / 2 KV heads, vocab 1000, 64 tokens; MLP
    /// 4096, so that the down projection splits its rows over 2 chunks as the full model's
    /// (8192: 4 chunks) does.
    pub fn tiny() -> Self {
        Self { layers: 2, hidden: 256, heads: 4, kv_heads: 2, inter: 4096, vocab: 1000, max_len: 64 }
    }

    /// Key (or value) rows of a layer: KV heads × 64.
    pub fn kv_rows(&self) -> usize {
        self.kv_heads * HEAD_DIM
    }

    /// Rows of a layer's QKV projection.
    pub fn qkv_rows(&self) -> usize {
        self.heads * HEAD_DIM + 2 * self.kv_rows()
    }

    /// Weights (parameters) of the whole model, the tied embedding counted once.
    pub fn parameters(&self) -> usize {
        let (h, i) = (self.hidden, self.inter);
        self.vocab * h + h + self.layers * (self.qkv_rows() * h + h * h + 2 * i * h + h * i + 2 * h)
    }

    /// Bytes a step at `pos` must move: every weight once, every layer's cached keys and
    /// values of tokens `0 ..= pos`, the embedding row and the logits.
    pub fn step_bytes(&self, pos: usize) -> usize {
        self.parameters() * 2 + self.layers * 2 * self.kv_rows() * (pos + 1) * 2 + self.hidden * 2 + self.vocab * 4
    }

    /// `Ok` when the kernels can run the shape; [`Error::UnsupportedShape`] says why not.
    pub fn check(&self) -> Result<()> {
        let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel: "the Llama decode step", reason });
        if self.hidden != self.heads * HEAD_DIM {
            return unsupported(format!("hidden {} is not {} heads of {HEAD_DIM}", self.hidden, self.heads));
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) || self.heads / self.kv_heads > MAX_GROUP {
            return unsupported(format!("{} query heads over {} KV heads: each KV head serves 1 to {MAX_GROUP} query heads", self.heads, self.kv_heads));
        }
        for k in [self.hidden, self.inter] {
            if !k.is_multiple_of(8) || !WARPS.is_multiple_of(chunks(k)) {
                return unsupported(format!("{k} columns: not whole 8-value vectors, or chunks of {} that do not divide {WARPS} warps", 32 * 8));
            }
        }
        if !self.vocab.is_multiple_of(2) {
            return unsupported(format!("vocab {} is odd (the LM head takes rows in pairs)", self.vocab));
        }
        if self.max_len == 0 || self.layers == 0 {
            return unsupported(String::from("no layers, or caches of no tokens"));
        }
        Ok(())
    }
}

/// One layer's weights.
pub struct Layer {
    pub norm1: Vec<bf16>,
    /// q, k, v heads' rows.
    pub w_qkv: Vec<bf16>,
    pub w_o: Vec<bf16>,
    pub norm2: Vec<bf16>,
    /// Gate rows, then up rows.
    pub w_gate_up: Vec<bf16>,
    pub w_down: Vec<bf16>,
}

/// A model with random weights and caches, and the token and position of the step.
pub struct Model {
    pub shape: Shape,
    /// `vocab × hidden`, also the LM head.
    pub embedding: Vec<bf16>,
    pub layers: Vec<Layer>,
    pub final_norm: Vec<bf16>,
    /// Per layer, `kv heads × max_len × 64`; tokens from `position` on are NaN.
    pub k_cache: Vec<Vec<bf16>>,
    pub v_cache: Vec<Vec<bf16>>,
    /// `max_len × 64`: per position, 32 cosines then 32 sines.
    pub rope: Vec<f32>,
    pub token: u32,
    pub position: usize,
    /// The first cache token that is NaN.
    nan_from: usize,
}

/// cos then sin of `pos·θ^(−2i/64)`, `i < 32`, for every position.
pub fn rope_table(max_len: usize) -> Vec<f32> {
    crate::rope::host::table(max_len, HEAD_DIM, THETA)
}

/// `y = W·x` for `W` row-major (`y.len() × x.len()`), in f64, over the host's threads.
fn matvec(w: &[bf16], x: &[f64]) -> Vec<f64> {
    w.par_chunks(x.len()).with_min_len(256).map(|row| row.iter().zip(x).map(|(w, x)| w.to_f64() * x).sum()).collect()
}

fn rms_norm(x: &[f64], w: &[bf16]) -> Vec<f64> {
    let rstd = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + EPS as f64).sqrt();
    x.iter().zip(w).map(|(x, w)| x * rstd * w.to_f64()).collect()
}

fn round(v: f64) -> f64 {
    bf16::from_f32(v as f32).to_f64()
}

/// The step's results: the logits, and each layer's appended k then v (rounded to bf16).
pub struct Reference {
    pub logits: Vec<f64>,
    pub kv_new: Vec<f64>,
}

impl Model {
    /// Random weights (one seed per matrix, drawn from `seed`, each matrix drawn in
    /// parallel chunks) scaled so that every projection's outputs have about unit variance,
    /// caches of `max_len` tokens, the step at `position` for `token`: a model for tests and
    /// benchmarks.
    pub fn random(shape: Shape, seed: u64, position: usize, token: u32) -> Result<Self> {
        shape.check()?;
        let (h, i, kv) = (shape.hidden, shape.inter, shape.kv_rows());
        let mut seeds_rng = StdRng::seed_from_u64(seed);
        let seeds: Vec<u64> = (0..8 * shape.layers + 3).map(|_| seeds_rng.random()).collect();
        let a = |k: usize| (3.0 / k as f32).sqrt();
        let cache_len = kv * shape.max_len;
        let layers: Vec<Layer> = seeds.chunks(8).take(shape.layers).map(|seed| Layer {
            norm1: uniform(seed[0], h, 0.5, 1.5),
            w_qkv: uniform(seed[1], shape.qkv_rows() * h, -a(h), a(h)),
            w_o: uniform(seed[2], h * h, -a(h), a(h)),
            norm2: uniform(seed[3], h, 0.5, 1.5),
            w_gate_up: uniform(seed[4], 2 * i * h, -a(h), a(h)),
            w_down: uniform(seed[5], h * i, -a(i), a(i)),
        }).collect();
        let (k_cache, v_cache) = seeds.chunks(8).take(shape.layers).map(|seed| (uniform(seed[6], cache_len, -1.7, 1.7), uniform(seed[7], cache_len, -1.7, 1.7))).unzip();
        let embedding = uniform(seeds[8 * shape.layers], shape.vocab * h, -0.05, 0.05);
        let mut model = Self {
            shape,
            embedding,
            layers,
            final_norm: uniform(seeds[8 * shape.layers + 1], h, 0.5, 1.5),
            k_cache,
            v_cache,
            rope: rope_table(shape.max_len),
            token,
            position,
            nan_from: shape.max_len,
        };
        model.set_position(position);
        Ok(model)
    }

    /// Whether the kernels take this model: its shape ([`Shape::check`]), the token and the
    /// position inside the vocabulary and the caches, and the length of every array. Both
    /// steps' `Buffers::upload` check it first: an array of the wrong length would otherwise
    /// shift every layer stacked after it, or make a kernel trap, which ends the CUDA context.
    pub fn check(&self) -> Result<()> {
        let s = self.shape;
        s.check()?;
        let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel: "the Llama decode step", reason });
        if self.token as usize >= s.vocab || self.position >= s.max_len {
            return unsupported(format!("token {} at position {}: the vocabulary has {} tokens, the caches {}", self.token, self.position, s.vocab, s.max_len));
        }
        if self.layers.len() != s.layers || self.k_cache.len() != s.layers || self.v_cache.len() != s.layers {
            let (l, k, v) = (self.layers.len(), self.k_cache.len(), self.v_cache.len());
            return unsupported(format!("{l} layers, {k} k caches and {v} v caches for a shape of {} layers", s.layers));
        }
        let (h, i, cache) = (s.hidden, s.inter, s.kv_rows() * s.max_len);
        let whole = [("embedding", self.embedding.len(), s.vocab * h), ("final_norm", self.final_norm.len(), h), ("rope", self.rope.len(), s.max_len * HEAD_DIM)];
        let layers = self.layers.iter().zip(self.k_cache.iter().zip(&self.v_cache)).enumerate().flat_map(|(j, (l, (k, v)))| {
            let arrays = [
                ("norm1", l.norm1.len(), h),
                ("w_qkv", l.w_qkv.len(), s.qkv_rows() * h),
                ("w_o", l.w_o.len(), h * h),
                ("norm2", l.norm2.len(), h),
                ("w_gate_up", l.w_gate_up.len(), 2 * i * h),
                ("w_down", l.w_down.len(), h * i),
                ("k_cache", k.len(), cache),
                ("v_cache", v.len(), cache),
            ];
            arrays.map(|(name, len, need)| (Some(j), name, len, need))
        });
        match whole.map(|(name, len, need)| (None, name, len, need)).into_iter().chain(layers).find(|&(_, _, len, need)| len != need) {
            None => Ok(()),
            Some((layer, name, len, need)) => {
                let at = layer.map(|j| format!("layer {j}'s ")).unwrap_or_default();
                unsupported(format!("{at}`{name}` holds {len} values; the shape needs {need}"))
            }
        }
    }

    /// The same weights and caches for a step at `position`: cache tokens `position ..`
    /// become NaN, so that the new token must be written and nothing past it read.
    pub fn set_position(&mut self, position: usize) {
        let s = self.shape;
        assert!(position < s.max_len, "position {position} is past the cache ({})", s.max_len);
        let nan = bf16::from_f32(f32::NAN);
        for (c, cache) in self.k_cache.iter_mut().chain(self.v_cache.iter_mut()).enumerate() {
            for head in 0..s.kv_heads {
                let rows = head * s.max_len * HEAD_DIM;
                if position > self.nan_from {
                    // Tokens that were NaN become random again.
                    let mut rng = StdRng::seed_from_u64((c * s.kv_heads + head) as u64);
                    cache[rows + self.nan_from * HEAD_DIM..rows + position * HEAD_DIM].iter_mut().for_each(|v| *v = bf16::from_f32(rng.random_range(-1.7..1.7)));
                }
                cache[rows + position * HEAD_DIM..rows + s.max_len * HEAD_DIM].fill(nan);
            }
        }
        (self.position, self.nan_from) = (position, position);
    }

    /// The whole step in f64 (the appended k and v rounded to bf16, as the cache stores them).
    pub fn reference(&self) -> Reference {
        let s = self.shape;
        let (hd, pos) = (s.hidden, self.position);
        let group = s.heads / s.kv_heads;
        let rope = &self.rope[pos * HEAD_DIM..][..HEAD_DIM];
        let rotate = |v: &[f64]| -> Vec<f64> {
            let mut r = vec![0.0; HEAD_DIM];
            for i in 0..HEAD_DIM / 2 {
                let (c, sn) = (rope[i] as f64, rope[HEAD_DIM / 2 + i] as f64);
                r[i] = v[i] * c - v[i + HEAD_DIM / 2] * sn;
                r[i + HEAD_DIM / 2] = v[i + HEAD_DIM / 2] * c + v[i] * sn;
            }
            r
        };
        let mut x: Vec<f64> = self.embedding[self.token as usize * hd..][..hd].iter().map(|v| v.to_f64()).collect();
        let mut kv_new = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            let qkv = matvec(&layer.w_qkv, &rms_norm(&x, &layer.norm1));
            let (q, kv) = qkv.split_at(hd);
            let (k, v) = kv.split_at(s.kv_rows());
            let ks: Vec<Vec<f64>> = k.chunks(HEAD_DIM).map(|k| rotate(k).into_iter().map(round).collect()).collect();
            let vs: Vec<Vec<f64>> = v.chunks(HEAD_DIM).map(|v| v.iter().map(|&v| round(v)).collect()).collect();
            let mut attn = Vec::with_capacity(hd);
            for (head, q) in q.chunks(HEAD_DIM).enumerate() {
                let (q, kvh) = (rotate(q), head / group);
                let rows = kvh * s.max_len * HEAD_DIM;
                let cached = |cache: &[bf16], t: usize| -> Vec<f64> { cache[rows + t * HEAD_DIM..][..HEAD_DIM].iter().map(|v| v.to_f64()).collect() };
                let key = |t: usize| if t < pos { cached(&self.k_cache[l], t) } else { ks[kvh].clone() };
                let value = |t: usize| if t < pos { cached(&self.v_cache[l], t) } else { vs[kvh].clone() };
                let scores: Vec<f64> = (0..=pos).map(|t| key(t).iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() / (HEAD_DIM as f64).sqrt()).collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = p.iter().sum();
                let mut o = vec![0.0; HEAD_DIM];
                for (t, p) in p.iter().enumerate() {
                    for (o, v) in o.iter_mut().zip(value(t)) {
                        *o += p * v;
                    }
                }
                attn.extend(o.into_iter().map(|o| o / total));
            }
            for (x, y) in x.iter_mut().zip(matvec(&layer.w_o, &attn)) {
                *x += y;
            }
            let gate_up = matvec(&layer.w_gate_up, &rms_norm(&x, &layer.norm2));
            let (gate, up) = gate_up.split_at(s.inter);
            let act: Vec<f64> = gate.iter().zip(up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            for (x, y) in x.iter_mut().zip(matvec(&layer.w_down, &act)) {
                *x += y;
            }
            kv_new.extend(ks.into_iter().flatten());
            kv_new.extend(vs.into_iter().flatten());
        }
        Reference { logits: matvec(&self.embedding, &rms_norm(&x, &self.final_norm)), kv_new }
    }
}

impl Reference {
    /// The logits, then the appended rows: the order of [`Buffers::results`].
    pub fn all(&self) -> Vec<f64> {
        self.logits.iter().chain(&self.kv_new).copied().collect()
    }
}

/// One layer's weights and caches on a device.
pub struct DeviceLayer {
    pub norm1: Buffer<bf16>,
    pub w_qkv: Buffer<bf16>,
    pub w_o: Buffer<bf16>,
    pub norm2: Buffer<bf16>,
    pub w_gate_up: Buffer<bf16>,
    pub w_down: Buffer<bf16>,
    pub k_cache: Buffer<bf16>,
    pub v_cache: Buffer<bf16>,
}

/// A model's buffers on a device, with the step's activations (poisoned) and inputs.
pub struct Buffers {
    pub shape: Shape,
    pub embedding: Buffer<bf16>,
    pub final_norm: Buffer<bf16>,
    pub layers: Vec<DeviceLayer>,
    pub rope: Buffer<f32>,
    pub token: Buffer<u32>,
    pub position: Buffer<u32>,
    /// The residual stream.
    pub h: Buffer<f32>,
    pub q: Buffer<f32>,
    pub attn: Buffer<f32>,
    pub act: Buffer<f32>,
    pub logits: Buffer<f32>,
}

impl Buffers {
    /// Uploads `model`, activations and logits poisoned; refuses a model the kernels do not
    /// take ([`Model::check`]).
    pub fn upload(gpu: &Gpu, model: &Model) -> Result<Self> {
        model.check()?;
        let s = model.shape;
        let layers = model
            .layers
            .iter()
            .zip(model.k_cache.iter().zip(&model.v_cache))
            .map(|(l, (k, v))| {
                Ok(DeviceLayer {
                    norm1: gpu.upload(&l.norm1)?,
                    w_qkv: gpu.upload(&l.w_qkv)?,
                    w_o: gpu.upload(&l.w_o)?,
                    norm2: gpu.upload(&l.norm2)?,
                    w_gate_up: gpu.upload(&l.w_gate_up)?,
                    w_down: gpu.upload(&l.w_down)?,
                    k_cache: gpu.upload(k)?,
                    v_cache: gpu.upload(v)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let nan = |len: usize| gpu.upload(&vec![f32::NAN; len]);
        Ok(Self {
            shape: s,
            embedding: gpu.upload(&model.embedding)?,
            final_norm: gpu.upload(&model.final_norm)?,
            layers,
            rope: gpu.upload(&model.rope)?,
            token: gpu.upload(&[model.token])?,
            position: gpu.upload(&[model.position as u32])?,
            h: nan(s.hidden)?,
            q: nan(s.hidden)?,
            attn: nan(s.hidden)?,
            act: nan(s.inter)?,
            logits: nan(s.vocab)?,
        })
    }

    /// Poisons the activations and logits again, in new buffers (a graph captured before
    /// holds the old ones).
    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        let s = self.shape;
        for (buffer, len) in [(&mut self.h, s.hidden), (&mut self.q, s.hidden), (&mut self.attn, s.hidden), (&mut self.act, s.inter), (&mut self.logits, s.vocab)] {
            *buffer = gpu.upload(&vec![f32::NAN; len])?;
        }
        Ok(())
    }

    /// The logits, then each layer's cache rows at `position` (k, then v, every KV head).
    pub fn results(&self, gpu: &Gpu, position: usize) -> Result<Vec<f32>> {
        let s = self.shape;
        let mut values = gpu.download(&self.logits)?;
        for layer in &self.layers {
            for cache in [&layer.k_cache, &layer.v_cache] {
                let cache = gpu.download(cache)?;
                for head in 0..s.kv_heads {
                    values.extend(cache[(head * s.max_len + position) * HEAD_DIM..][..HEAD_DIM].iter().map(|v| v.to_f32()));
                }
            }
        }
        Ok(values)
    }
}

/// The six kernels, loaded, and how many projection blocks the device holds at once.
pub struct Kernels {
    /// Two blocks per SM (on the emulator, 4 blocks: so that the tiny model's blocks
    /// take several items each).
    pub resident: u32,
    embed: llama_embed::Kernel,
    qkv: llama_qkv::Kernel,
    attention: llama_attention::Kernel,
    residual: llama_residual::Kernel,
    gate_up: llama_gate_up::Kernel,
    lm_head: llama_lm_head::Kernel,
}

impl Kernels {
    /// Loads them on `gpu`.
    pub fn load(gpu: &Gpu) -> Result<Self> {
        let sms = gpu.multiprocessors()?.unwrap_or(2);
        Ok(Self {
            resident: 2 * sms as u32,
            embed: llama_embed::load(gpu)?,
            qkv: llama_qkv::load(gpu)?,
            attention: llama_attention::load(gpu)?,
            residual: llama_residual::load(gpu)?,
            gate_up: llama_gate_up::load(gpu)?,
            lm_head: llama_lm_head::load(gpu)?,
        })
    }
}

/// The launch of a projection over `pairs` row pairs of `k` columns: a block per item of
/// [`project`], at most `max_blocks`.
pub fn projection_config(pairs: usize, k: usize, max_blocks: u32, programmatic: bool) -> LaunchConfig {
    let blocks = (pairs.div_ceil(pairs_per_block(k)) as u32).min(max_blocks);
    LaunchConfig { grid: blocks.into(), block: BLOCK.into(), cluster: None, dynamic_smem_bytes: stage_bytes(k) as u32, programmatic, ..LaunchConfig::default() }
}

/// The attention's launch: a cluster of `cluster` (at most [`MAX_CLUSTER`]) blocks per KV head.
pub fn attention_config(shape: Shape, cluster: u32, programmatic: bool) -> LaunchConfig {
    assert!(cluster as usize <= MAX_CLUSTER, "clusters of {cluster} blocks: the attention merges at most {MAX_CLUSTER}");
    LaunchConfig { grid: (shape.kv_heads as u32 * cluster).into(), block: BLOCK.into(), cluster: Some(cluster.into()), programmatic, ..LaunchConfig::default() }
}

/// One decode step on `s`: 2 + 5 · layers launches, every one but the first launched
/// programmatically when `programmatic`; the attention with clusters of `cluster`.
pub fn step(k: &Kernels, s: &Stream, b: &mut Buffers, cluster: u32, programmatic: bool) -> Result<()> {
    let shape = b.shape;
    let (h, i, max_len) = (shape.hidden, shape.inter, shape.max_len as u32);
    let embed = LaunchConfig { grid: 1.into(), block: BLOCK.into(), ..Default::default() };
    k.embed.launch(s, &embed, &b.embedding, &b.token, &mut b.h)?;
    let (p, r) = (programmatic, k.resident);
    for layer in &mut b.layers {
        k.qkv.launch(s, &projection_config(shape.qkv_rows() / 2, h, r, p), &mut b.h, &layer.norm1, &layer.w_qkv, &b.rope, &b.position, &mut b.q, &mut layer.k_cache, &mut layer.v_cache, max_len)?;
        k.attention.launch(s, &attention_config(shape, cluster, p), &mut b.q, &mut layer.k_cache, &mut layer.v_cache, &b.position, &mut b.attn, max_len)?;
        k.residual.launch(s, &projection_config(h / 2, h, r, p), &mut b.attn, &layer.w_o, &mut b.h)?;
        k.gate_up.launch(s, &projection_config(i, h, r, p), &mut b.h, &layer.norm2, &layer.w_gate_up, &mut b.act)?;
        k.residual.launch(s, &projection_config(h / 2, i, r, p), &mut b.act, &layer.w_down, &mut b.h)?;
    }
    k.lm_head.launch(s, &projection_config(shape.vocab / 2, h, r, p), &mut b.h, &b.final_norm, &b.embedding, &mut b.logits)
}

/// Relative error allowed against the f64 reference over the logits and the appended k, v.
pub const TOLERANCE: f64 = 1e-3;
