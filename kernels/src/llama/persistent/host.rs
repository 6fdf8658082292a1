//! The step's buffers (weights stacked over the layers), its launch, and the check against
//! the chain's f64 reference.

use super::*;
use super::super::chain::host::{Layer, Model, Shape};
use super::super::chain::stage_bytes;
use clusterfuse::host::{Buffer, Gpu, LaunchConfig, Published, Result, Stream};

/// A model's buffers for the persistent step: weights and caches stacked over the layers,
/// the published activations (poisoned), the logits.
pub struct Buffers {
    pub shape: Shape,
    embedding: Buffer<bf16>,
    final_norm: Buffer<bf16>,
    norm1: Buffer<bf16>,
    w_qkv: Buffer<bf16>,
    w_o: Buffer<bf16>,
    norm2: Buffer<bf16>,
    w_gate_up: Buffer<bf16>,
    w_down: Buffer<bf16>,
    k_cache: Buffer<bf16>,
    v_cache: Buffer<bf16>,
    rope: Buffer<f32>,
    token: Buffer<u32>,
    position: Buffer<u32>,
    h: Published<f32>,
    q: Published<f32>,
    kv: Published<bf16>,
    attn: Published<f32>,
    act: Published<f32>,
    logits: Buffer<f32>,
    /// The stage timeline (see `Timeline`): one value when off.
    timeline: Buffer<u64>,
}

impl Buffers {
    /// Uploads `model` (the layers' matrices stacked), activations and logits poisoned;
    /// refuses a model the kernels do not take ([`Model::check`]).
    pub fn upload(gpu: &Gpu, model: &Model) -> Result<Self> {
        model.check()?;
        let s = model.shape;
        let stacked = |part: fn(&Layer) -> &Vec<bf16>| gpu.upload(&model.layers.iter().flat_map(|l| part(l).iter().copied()).collect::<Vec<_>>());
        let nan = |len: usize, tile: u32| Published::new(gpu, gpu.upload(&vec![f32::NAN; len])?, tile);
        Ok(Self {
            shape: s,
            embedding: gpu.upload(&model.embedding)?,
            final_norm: gpu.upload(&model.final_norm)?,
            norm1: stacked(|l| &l.norm1)?,
            w_qkv: stacked(|l| &l.w_qkv)?,
            w_o: stacked(|l| &l.w_o)?,
            norm2: stacked(|l| &l.norm2)?,
            w_gate_up: stacked(|l| &l.w_gate_up)?,
            w_down: stacked(|l| &l.w_down)?,
            k_cache: gpu.upload(&model.k_cache.concat())?,
            v_cache: gpu.upload(&model.v_cache.concat())?,
            rope: gpu.upload(&model.rope)?,
            token: gpu.upload(&[model.token])?,
            position: gpu.upload(&[model.position as u32])?,
            h: nan((2 * s.layers + 1) * s.hidden, H_TILE)?,
            q: nan(s.layers * s.hidden, QKV_TILE)?,
            kv: Published::new(gpu, gpu.upload(&vec![bf16::from_f32(f32::NAN); s.layers * 2 * s.kv_rows()])?, QKV_TILE)?,
            attn: nan(s.layers * s.hidden, ATTN_TILE)?,
            act: nan(s.layers * s.inter, ACT_TILE)?,
            logits: gpu.upload(&vec![f32::NAN; s.vocab])?,
            timeline: gpu.zeros(1)?,
        })
    }

    /// Stamps the stages of `blocks` blocks from the next launch on (see [`timeline`](Self::timeline)).
    pub fn record_timeline(&mut self, gpu: &Gpu, blocks: u32) -> Result<()> {
        self.timeline = gpu.zeros(blocks as usize * (2 + STAGES * self.shape.layers) * 3)?;
        Ok(())
    }

    /// Per block and stage (the embedding, [`STAGES`] a layer, the LM head), the
    /// `%globaltimer` nanoseconds at its start, once its input was ready, and at its end.
    pub fn timeline(&self, gpu: &Gpu) -> Result<Vec<[u64; 3]>> {
        Ok(gpu.download(&self.timeline)?.chunks(3).map(|c| [c[0], c[1], c[2]]).collect())
    }

    /// Poisons the logits again, in a new buffer (a graph captured before holds the old one).
    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.logits = gpu.upload(&vec![f32::NAN; self.shape.vocab])?;
        Ok(())
    }

    /// The logits, then each layer's cache rows at `position` (k, then v, every KV head):
    /// the order of the chain's results.
    pub fn results(&self, gpu: &Gpu, position: usize) -> Result<Vec<f32>> {
        let s = self.shape;
        let mut values = gpu.download(&self.logits)?;
        let (k, v) = (gpu.download(&self.k_cache)?, gpu.download(&self.v_cache)?);
        for l in 0..s.layers {
            for cache in [&k, &v] {
                for head in 0..s.kv_heads {
                    values.extend(cache[((l * s.kv_heads + head) * s.max_len + position) * HEAD_DIM..][..HEAD_DIM].iter().map(|v| v.to_f32()));
                }
            }
        }
        Ok(values)
    }
}

/// The launch: every block the GPU holds at once (at most two per SM, a whole number of
/// clusters of `cluster`), dynamic shared memory for staging the MLP activation.
pub fn config(kernel: &llama_step::Kernel, gpu: &Gpu, shape: Shape, cluster: u32) -> Result<LaunchConfig> {
    let mut config = LaunchConfig {
        grid: cluster.into(),
        block: BLOCK.into(),
        cluster: Some(cluster.into()),
        dynamic_smem_bytes: stage_bytes(shape.inter.max(shape.hidden)) as u32,
        ..LaunchConfig::default()
    };
    let plan = kernel.raw().plan(&config)?;
    let sms = gpu.multiprocessors()?.unwrap_or(4) as u64;
    let resident = kernel.raw().max_resident_blocks(gpu.stream(), &plan)?.min(2 * sms);
    config.grid = ((resident / cluster as u64 * cluster as u64) as u32).into();
    Ok(config)
}

/// Where a step's time goes, from a timeline (`Buffers::timeline`) of `blocks` blocks, per
/// kind of stage (the embedding, QKV, attention, W_o, gate/up, down, the LM head), in µs:
/// how far the last block's end moved on during the stage (summed over the layers: the
/// stages' shares of the step), and per block that had work in it, the mean wait for its
/// input and the mean time from the input to the end.
pub fn phases(timeline: &[[u64; 3]], blocks: usize) -> Vec<(&'static str, f64, f64, f64)> {
    const NAMES: [&str; 7] = ["embedding", "QKV", "attention", "W_o", "gate/up", "down", "LM head"];
    let stages = timeline.len() / blocks;
    let kind = |s: usize| if s == 0 { 0 } else if s == stages - 1 { 6 } else { 1 + (s - 1) % STAGES };
    let start = timeline.iter().map(|t| t[START]).filter(|&t| t > 0).min().unwrap_or(0);
    let mut rows: Vec<(&str, f64, f64, f64, usize)> = NAMES.iter().map(|&n| (n, 0.0, 0.0, 0.0, 0)).collect();
    let mut last_end = start;
    for s in 0..stages {
        let stamps: Vec<[u64; 3]> = (0..blocks).map(|b| timeline[b * stages + s]).collect();
        let end = stamps.iter().map(|t| t[END]).max().unwrap_or(last_end);
        let row = &mut rows[kind(s)];
        row.1 += end.saturating_sub(last_end) as f64 / 1e3;
        for t in stamps.iter().filter(|t| t[READY] > 0) {
            row.2 += t[READY].saturating_sub(t[START]) as f64 / 1e3;
            row.3 += t[END].saturating_sub(t[READY]) as f64 / 1e3;
            row.4 += 1;
        }
        last_end = end;
    }
    rows.into_iter().map(|(n, share, wait, work, count)| (n, share, wait / count.max(1) as f64, work / count.max(1) as f64)).collect()
}

/// Layer `l`'s stages from a timeline of `blocks` blocks, in µs from the layer's first
/// start: each stage's first start, last input ready, and last end.
pub fn layer_stages(timeline: &[[u64; 3]], blocks: usize, l: usize) -> Vec<[f64; 3]> {
    let stages = timeline.len() / blocks;
    let of = |s: usize| (0..blocks).map(move |b| timeline[b * stages + s]);
    let first = 1 + STAGES * l;
    let origin = of(first).map(|t| t[START]).min().unwrap_or(0);
    let us = |t: u64| t.saturating_sub(origin) as f64 / 1e3;
    (first..first + STAGES)
        .map(|s| {
            let start = of(s).map(|t| t[START]).min().unwrap_or(0);
            let ready = of(s).map(|t| t[READY]).max().unwrap_or(0);
            let end = of(s).map(|t| t[END]).max().unwrap_or(0);
            [us(start), us(ready), us(end)]
        })
        .collect()
}

/// One decode step: one launch.
pub fn step(kernel: &llama_step::Kernel, s: &Stream, config: &LaunchConfig, b: &mut Buffers) -> Result<()> {
    kernel.launch(
        s,
        config,
        &b.embedding,
        &b.token,
        &b.position,
        &b.rope,
        &b.norm1,
        &b.w_qkv,
        &b.w_o,
        &b.norm2,
        &b.w_gate_up,
        &b.w_down,
        &b.final_norm,
        &mut b.k_cache,
        &mut b.v_cache,
        &mut b.h,
        &mut b.q,
        &mut b.kv,
        &mut b.attn,
        &mut b.act,
        &mut b.logits,
        &mut b.timeline,
        b.shape.max_len as u32,
    )
}
