//! One decode step on the host: random inputs, the f64 reference, device buffers, and
//! both variants' launches.

use super::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use clusterfuse::host::cudarc::driver::DeviceRepr;
use clusterfuse::host::{Buffer, Gpu, Published, Result, Stream};
use rand::Rng;

/// An element type of the weights, activations and cache, with its fused kernels.
pub trait DecodeType: HalfFloat + DeviceRepr + Copy + 'static {
    /// The type's name in reports.
    const NAME: &'static str;
    /// Relative error allowed against the f64 reference (the type's rounding of `out`
    /// and of the appended k, v, with room for f32 accumulation).
    const TOLERANCE: f64;
    /// The fused kernels of this type, loaded on one device.
    type Kernels;
    /// Loads them.
    fn load(gpu: &Gpu) -> Result<Self::Kernels>;
    /// Fused 1/2 at `b`'s batch, with clusters of `cluster`, on `stream`.
    fn attention(kernels: &Self::Kernels, stream: &Stream, b: &mut Buffers<Self>, cluster: u32) -> Result<()>;
    /// Fused 2/2 at `b`'s batch, on `stream`; with `programmatic`, a programmatic dependent
    /// launch that starts streaming `W_o` while fused 1/2 finishes.
    fn o_proj(kernels: &Self::Kernels, stream: &Stream, b: &mut Buffers<Self>, programmatic: bool) -> Result<()>;
    /// The spread variant (batch 1) on `stream`: spread 1/3, then spread 2/3 with clusters
    /// of `cluster` and the output projection, both launched programmatically with
    /// `programmatic`.
    fn spread(kernels: &Self::Kernels, stream: &Stream, b: &mut Buffers<Self>, cluster: u32, programmatic: bool) -> Result<()>;
    /// The persistent block (batch 1) on `stream`, launched with `config`
    /// ([`persistent_config`]).
    fn persistent(kernels: &Self::Kernels, stream: &Stream, b: &mut Buffers<Self>, config: &LaunchConfig) -> Result<()>;
    /// Most blocks of the persistent block launched as `config` resident at once.
    fn persistent_residency(kernels: &Self::Kernels, gpu: &Gpu, config: &LaunchConfig) -> Result<u64>;
    /// Most clusters of `cluster` blocks of fused 1/2 resident at once, at `batch`.
    fn max_active_clusters(kernels: &Self::Kernels, gpu: &Gpu, hidden: usize, batch: usize, cluster: u32) -> Result<u32>;
}

/// The fused kernels of one type, batch 1 and batch tile 8, spread 1/3 and 2/3, and the
/// persistent block.
pub struct Kernels<A1, A8, O1, O8, QR, AA, P> {
    attention: A1,
    attention8: A8,
    o_proj: O1,
    o_proj8: O8,
    qkv_rope: QR,
    attend: AA,
    persistent: P,
}

fn config(grid: usize, block: u32, cluster: Option<u32>, dynamic_smem_bytes: usize) -> LaunchConfig {
    LaunchConfig { grid: (grid as u32).into(), block: block.into(), cluster: cluster.map(Into::into), dynamic_smem_bytes: dynamic_smem_bytes as u32, ..LaunchConfig::default() }
}

/// The batch tile of the kernels that run `batch` tokens.
fn tile(batch: usize) -> usize {
    assert!((1..=MAX_BATCH).contains(&batch), "batch {batch} is not 1 ..= {MAX_BATCH}");
    if batch == 1 { 1 } else { MAX_BATCH }
}

/// Fused 1/2's launch: a cluster per head, the tile's `x ⊙ norm_w` columns in dynamic
/// shared memory.
pub fn attention_config(hidden: usize, batch: usize, cluster: u32) -> LaunchConfig {
    let c = cluster as usize;
    assert!(hidden.is_multiple_of(HEAD_DIM) && hidden.is_multiple_of(8 * c), "cluster {cluster} does not divide hidden {hidden} into 16-byte vectors");
    config(hidden / HEAD_DIM * c, BLOCK, Some(cluster), stage_units(tile(batch)) * hidden / c * 2)
}

/// Fused 2/2's launch: `8 · O_ROWS` rows a block, all of `attn` in dynamic shared memory.
pub fn o_proj_config(hidden: usize, batch: usize) -> LaunchConfig {
    let t = usize::from(tile(batch) > 1);
    let rows = WARPS * O_ROWS[t];
    assert!(hidden.is_multiple_of(rows), "hidden {hidden} is not a multiple of {rows}");
    config(hidden / rows, BLOCK, None, stage_units(tile(batch)) * hidden * 2)
}

/// Where the persistent block's time goes, from a timeline of its blocks (see [`PHASES`]),
/// in µs from the first block's start: the last head done, the last output projection
/// input ready, the last end; and the mean time per block from input ready to end, over
/// blocks with an item.
pub fn persistent_phases(timeline: &[u64]) -> [f64; 4] {
    let blocks: Vec<&[u64]> = timeline.chunks(PHASES).collect();
    let origin = blocks.iter().map(|b| b[0]).filter(|&t| t > 0).min().unwrap_or(0);
    let last = |point: usize| blocks.iter().map(|b| b[point]).max().unwrap_or(0).saturating_sub(origin) as f64 / 1e3;
    let working: Vec<f64> = blocks.iter().filter(|b| b[2] > 0).map(|b| b[3].saturating_sub(b[2]) as f64 / 1e3).collect();
    [last(1), last(2), last(3), working.iter().sum::<f64>() / working.len().max(1) as f64]
}

/// The persistent block's launch (batch 1): clusters of `cluster`, enough blocks for the
/// heads' clusters and the output projection's items together, at most those the GPU
/// holds at once (a whole number of clusters); dynamic shared memory for the larger of the
/// attention's and the output projection's staging.
pub fn persistent_config<T: DecodeType>(kernels: &T::Kernels, gpu: &Gpu, hidden: usize, cluster: u32) -> Result<LaunchConfig> {
    let heads_blocks = attention_config(hidden, 1, cluster).grid.x;
    let rows = WARPS * PERSISTENT_O_ROWS;
    assert!(hidden.is_multiple_of(rows), "hidden {hidden} is not a multiple of {rows}");
    let smem = stage_units(1) * hidden * 2;
    let mut config = config(cluster as usize, BLOCK, Some(cluster), smem);
    let resident = T::persistent_residency(kernels, gpu, &config)?;
    let wanted = (heads_blocks as u64 + (hidden / rows) as u64).min(resident);
    config.grid = ((wanted / cluster as u64 * cluster as u64) as u32).into();
    Ok(config)
}

/// Spread 1/3's launch: a pair of rows of `W_qkv` a warp, `x ⊙ norm_w` in dynamic shared
/// memory.
pub fn qkv_rope_config(hidden: usize) -> LaunchConfig {
    let pairs = WARPS * SPREAD_PAIRS;
    assert!(hidden.is_multiple_of(HEAD_DIM) && (3 * hidden / 2).is_multiple_of(pairs), "hidden {hidden} is not a multiple of {HEAD_DIM} or its {} row pairs of {pairs} a block", 3 * hidden / 2);
    config(3 * hidden / 2 / pairs, BLOCK, None, stage_units(1) * hidden * 2)
}

/// Spread 2/3's launch: a cluster of `cluster` blocks per head.
pub fn attend_config(hidden: usize, cluster: u32, programmatic: bool) -> LaunchConfig {
    LaunchConfig { programmatic, ..config(hidden / HEAD_DIM * cluster as usize, BLOCK, Some(cluster), 0) }
}

macro_rules! decode_type {
    ($($t:ident, $name:literal, $tolerance:literal: $attention:ident, $attention8:ident, $o_proj:ident, $o_proj8:ident, $qkv_rope:ident, $attend:ident, $persistent:ident;)*) => {$(
        impl DecodeType for $t {
            const NAME: &'static str = $name;
            const TOLERANCE: f64 = $tolerance;
            type Kernels = Kernels<$attention::Kernel, $attention8::Kernel, $o_proj::Kernel, $o_proj8::Kernel, $qkv_rope::Kernel, $attend::Kernel, $persistent::Kernel>;

            fn load(gpu: &Gpu) -> Result<Self::Kernels> {
                Ok(Kernels {
                    attention: $attention::load(gpu)?,
                    attention8: $attention8::load(gpu)?,
                    o_proj: $o_proj::load(gpu)?,
                    o_proj8: $o_proj8::load(gpu)?,
                    qkv_rope: $qkv_rope::load(gpu)?,
                    attend: $attend::load(gpu)?,
                    persistent: $persistent::load(gpu)?,
                })
            }

            fn attention(k: &Self::Kernels, s: &Stream, b: &mut Buffers<Self>, cluster: u32) -> Result<()> {
                let (c, max_len) = (attention_config(b.hidden, b.batch, cluster), b.max_len as u32);
                if b.batch == 1 {
                    k.attention.launch(s, &c, &b.x, &b.norm_w, &b.w_qkv, &b.rope, &b.positions, &mut b.k_cache, &mut b.v_cache, b.attn.data_mut(), max_len)
                } else {
                    k.attention8.launch(s, &c, &b.x, &b.norm_w, &b.w_qkv, &b.rope, &b.positions, &mut b.k_cache, &mut b.v_cache, b.attn.data_mut(), max_len)
                }
            }

            fn o_proj(k: &Self::Kernels, s: &Stream, b: &mut Buffers<Self>, programmatic: bool) -> Result<()> {
                let (c, batch) = (LaunchConfig { programmatic, ..o_proj_config(b.hidden, b.batch) }, b.batch as u32);
                if b.batch == 1 {
                    k.o_proj.launch(s, &c, b.attn.data_mut(), &b.w_o, &b.x, &mut b.out, batch)
                } else {
                    k.o_proj8.launch(s, &c, b.attn.data_mut(), &b.w_o, &b.x, &mut b.out, batch)
                }
            }

            fn spread(k: &Self::Kernels, s: &Stream, b: &mut Buffers<Self>, cluster: u32, programmatic: bool) -> Result<()> {
                assert_eq!(b.batch, 1, "the spread variant runs batch 1");
                let max_len = b.max_len as u32;
                k.qkv_rope.launch(s, &qkv_rope_config(b.hidden), &b.x, &b.norm_w, &b.w_qkv, &b.rope, &b.positions, &mut b.q, &mut b.k_cache, &mut b.v_cache, max_len)?;
                k.attend.launch(s, &attend_config(b.hidden, cluster, programmatic), &b.q, &b.positions, &mut b.k_cache, &mut b.v_cache, b.attn.data_mut(), max_len)?;
                Self::o_proj(k, s, b, programmatic)
            }

            fn persistent(k: &Self::Kernels, s: &Stream, b: &mut Buffers<Self>, config: &LaunchConfig) -> Result<()> {
                assert_eq!(b.batch, 1, "the persistent block runs batch 1");
                let max_len = b.max_len as u32;
                k.persistent.launch(s, config, &b.x, &b.norm_w, &b.w_qkv, &b.rope, &b.positions, &mut b.k_cache, &mut b.v_cache, &mut b.attn, &b.w_o, &mut b.out, max_len, &mut b.timeline)
            }

            fn persistent_residency(k: &Self::Kernels, gpu: &Gpu, config: &LaunchConfig) -> Result<u64> {
                k.persistent.raw().max_resident_blocks(gpu.stream(), &k.persistent.raw().plan(config)?)
            }

            fn max_active_clusters(k: &Self::Kernels, gpu: &Gpu, hidden: usize, batch: usize, cluster: u32) -> Result<u32> {
                let raw = if batch == 1 { k.attention.raw() } else { k.attention8.raw() };
                raw.max_active_clusters(gpu.stream(), &raw.plan(&attention_config(hidden, batch, cluster))?)
            }
        }
    )*};
}

decode_type! {
    f16, "f16", 2e-3: decode_attention_f16, decode_attention_f16_b8, decode_o_proj_f16, decode_o_proj_f16_b8, decode_qkv_rope_f16, decode_attend_appended_f16, decode_block_persistent_f16;
    bf16, "bf16", 5e-3: decode_attention_bf16, decode_attention_bf16_b8, decode_o_proj_bf16, decode_o_proj_bf16_b8, decode_qkv_rope_bf16, decode_attend_appended_bf16, decode_block_persistent_bf16;
}

/// One decode step's inputs for a batch of sequences. Cache tokens `pos ..` of each
/// sequence start as NaN, so that the new token must be written and nothing past it read.
pub struct Step<T> {
    pub hidden: usize,
    pub max_len: usize,
    /// Each sequence's position: its new token's index in its cache.
    pub positions: Vec<usize>,
    /// `batch × hidden`.
    pub x: Vec<T>,
    pub norm_w: Vec<T>,
    pub w_qkv: Vec<T>,
    pub w_o: Vec<T>,
    /// `batch × 128`: each sequence's [`rope`].
    pub rope: Vec<f32>,
    /// `batch × heads × max_len × 128`.
    pub k_cache: Vec<T>,
    pub v_cache: Vec<T>,
}

/// The step's results: `out` (`batch × hidden`), and the appended k and v (`batch × heads
/// × 128`, rounded as the cache stores them).
pub struct Reference {
    pub out: Vec<f64>,
    pub k_new: Vec<f64>,
    pub v_new: Vec<f64>,
}

impl Reference {
    /// `out`, then `k_new`, then `v_new`: the order of [`Buffers::results`].
    pub fn all(&self) -> Vec<f64> {
        self.out.iter().chain(&self.k_new).chain(&self.v_new).copied().collect()
    }
}

fn uniform<T: HalfFloat>(rng: &mut StdRng, len: usize, lo: f32, hi: f32) -> Vec<T> {
    (0..len).map(|_| T::from_f32(rng.random_range(lo..hi))).collect()
}

fn wide<T: HalfFloat>(v: &T) -> f64 {
    v.to_f32() as f64
}

/// cos then sin of `pos·θ^(−2i/128)`, `i < 64`, as Hugging Face's Llama computes them.
pub fn rope(pos: usize) -> Vec<f32> {
    crate::rope::host::angles(pos, HEAD_DIM, THETA)
}

impl<T> Step<T> {
    /// Heads.
    pub fn heads(&self) -> usize {
        self.hidden / HEAD_DIM
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.positions.len()
    }
}

impl<T: DecodeType> Step<T> {
    /// Random inputs drawn from `seed` for sequences at `positions`, scaled so that
    /// q·k/√128 spreads over a few units and the attention term of `out` is as large as
    /// the residual: a step for tests and benchmarks.
    pub fn random(seed: u64, hidden: usize, max_len: usize, positions: &[usize]) -> Self {
        let (heads, batch) = (hidden / HEAD_DIM, positions.len());
        let a = 1.0 / (hidden as f32).sqrt();
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cache = |bound: f32| -> Vec<T> {
            let mut c = uniform(&mut rng, batch * heads * max_len * HEAD_DIM, -bound, bound);
            for (s, &pos) in positions.iter().enumerate() {
                for h in 0..heads {
                    let rows = (s * heads + h) * max_len;
                    c[(rows + pos) * HEAD_DIM..(rows + max_len) * HEAD_DIM].fill(T::from_f32(f32::NAN));
                }
            }
            c
        };
        let (k_cache, v_cache) = (cache(2.4), cache(1.0));
        let mut step = Self {
            hidden,
            max_len,
            positions: Vec::new(),
            x: uniform(&mut rng, batch * hidden, -0.5, 0.5),
            norm_w: uniform(&mut rng, hidden, 0.5, 1.5),
            w_qkv: uniform(&mut rng, 3 * hidden * hidden, -2.4 * a, 2.4 * a),
            w_o: uniform(&mut rng, hidden * hidden, -8.0 * a, 8.0 * a),
            rope: Vec::new(),
            k_cache,
            v_cache,
        };
        step.set_positions(positions);
        step
    }

    /// The same weights and caches for a step at `positions` (each cache past its
    /// position stays as it is).
    pub fn set_positions(&mut self, positions: &[usize]) {
        assert!(positions.iter().all(|&p| p < self.max_len), "a position in {positions:?} is past the cache");
        assert_eq!(positions.len() * self.hidden, self.x.len(), "one position per sequence");
        self.positions = positions.to_vec();
        self.rope = positions.iter().flat_map(|&p| rope(p)).collect();
    }

    /// The whole block in f64 (the appended k and v rounded to `T`, as the cache stores them).
    pub fn reference(&self) -> Reference {
        let (h, heads) = (self.hidden, self.heads());
        let round = |v: f64| T::from_f32(v as f32).to_f32() as f64;
        let (mut out, mut k_new, mut v_new) = (Vec::new(), Vec::new(), Vec::new());
        for (s, &pos) in self.positions.iter().enumerate() {
            let x: Vec<f64> = self.x[s * h..(s + 1) * h].iter().map(wide).collect();
            let rstd = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / h as f64 + EPS as f64).sqrt();
            let xn: Vec<f64> = x.iter().zip(&self.norm_w).map(|(v, w)| v * rstd * wide(w)).collect();
            let qkv: Vec<f64> = self.w_qkv.chunks(h).map(|row| row.iter().zip(&xn).map(|(w, v)| wide(w) * v).sum()).collect();
            let rope = &self.rope[s * HEAD_DIM..][..HEAD_DIM];
            let rotate = |v: &[f64]| -> Vec<f64> {
                let mut r = vec![0.0; HEAD_DIM];
                for i in 0..64 {
                    let (c, sn) = (rope[i] as f64, rope[64 + i] as f64);
                    r[i] = v[i] * c - v[i + 64] * sn;
                    r[i + 64] = v[i + 64] * c + v[i] * sn;
                }
                r
            };
            let mut attn = Vec::with_capacity(h);
            for head in 0..heads {
                let at = |part: usize| &qkv[part * h + head * HEAD_DIM..part * h + (head + 1) * HEAD_DIM];
                let q = rotate(at(0));
                let k: Vec<f64> = rotate(at(1)).into_iter().map(round).collect();
                let v: Vec<f64> = at(2).iter().map(|&v| round(v)).collect();
                let rows = (s * heads + head) * self.max_len * HEAD_DIM;
                let key = |t: usize| &self.k_cache[rows + t * HEAD_DIM..][..HEAD_DIM];
                let value = |t: usize| &self.v_cache[rows + t * HEAD_DIM..][..HEAD_DIM];
                let scale = 1.0 / (HEAD_DIM as f64).sqrt();
                let mut scores: Vec<f64> = (0..pos).map(|t| key(t).iter().zip(&q).map(|(a, b)| wide(a) * b).sum::<f64>() * scale).collect();
                scores.push(k.iter().zip(&q).map(|(a, b)| a * b).sum::<f64>() * scale);
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let p: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let l: f64 = p.iter().sum();
                let mut o = vec![0.0; HEAD_DIM];
                for (t, &p) in p.iter().enumerate() {
                    let row: Vec<f64> = if t < pos { value(t).iter().map(wide).collect() } else { v.clone() };
                    for (o, r) in o.iter_mut().zip(row) {
                        *o += p * r;
                    }
                }
                attn.extend(o.into_iter().map(|o| o / l));
                k_new.extend(k);
                v_new.extend(v);
            }
            out.extend(self.w_o.chunks(h).zip(&x).map(|(row, x)| x + row.iter().zip(&attn).map(|(w, a)| wide(w) * a).sum::<f64>()));
        }
        Reference { out, k_new, v_new }
    }
}

/// A step's buffers on a device, with both variants' scratch and a poisoned `out`.
pub struct Buffers<T: DeviceRepr> {
    pub hidden: usize,
    pub max_len: usize,
    pub batch: usize,
    pub x: Buffer<T>,
    pub norm_w: Buffer<T>,
    pub w_qkv: Buffer<T>,
    pub w_o: Buffer<T>,
    pub rope: Buffer<f32>,
    pub positions: Buffer<u32>,
    /// `positions`, on the host.
    pub host_positions: Vec<u32>,
    pub k_cache: Buffer<T>,
    pub v_cache: Buffer<T>,
    pub out: Buffer<T>,
    /// The heads' attention outputs, `batch × hidden` (f32), in tiles of a head (the
    /// persistent block publishes them; the other variants use the data alone).
    pub attn: Published<f32>,
    /// The spread variant's rotated q, `batch × hidden` (f32).
    pub q: Buffer<f32>,
    /// The persistent block's timeline (see [`PHASES`]): one value, when off.
    pub timeline: Buffer<u64>,
}

impl<T: DecodeType> Buffers<T> {
    /// Uploads `step`, with `out`, `attn` and `q` poisoned.
    pub fn upload(gpu: &Gpu, step: &Step<T>) -> Result<Self> {
        let (h, batch) = (step.hidden, step.batch());
        let positions: Vec<u32> = step.positions.iter().map(|&p| p as u32).collect();
        Ok(Self {
            hidden: h,
            max_len: step.max_len,
            batch,
            x: gpu.upload(&step.x)?,
            norm_w: gpu.upload(&step.norm_w)?,
            w_qkv: gpu.upload(&step.w_qkv)?,
            w_o: gpu.upload(&step.w_o)?,
            rope: gpu.upload(&step.rope)?,
            positions: gpu.upload(&positions)?,
            host_positions: positions,
            k_cache: gpu.upload(&step.k_cache)?,
            v_cache: gpu.upload(&step.v_cache)?,
            out: gpu.upload(&vec![T::from_f32(f32::NAN); batch * h])?,
            attn: Published::new(gpu, gpu.upload(&vec![f32::NAN; batch * h])?, ATTN_TILE)?,
            q: gpu.upload(&vec![f32::NAN; batch * h])?,
            timeline: gpu.upload(&[0u64])?,
        })
    }

    /// Stamps the persistent block's phases in the next launches of `blocks` blocks (see
    /// [`PHASES`]), or stops with `blocks == 0`.
    pub fn record_timeline(&mut self, gpu: &Gpu, blocks: u32) -> Result<()> {
        self.timeline = gpu.upload(&vec![0u64; (blocks as usize * PHASES).max(1)])?;
        Ok(())
    }

    /// Poisons `out`, `attn` and `q` again.
    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        self.out = gpu.upload(&vec![T::from_f32(f32::NAN); self.out.len()])?;
        self.attn = Published::new(gpu, gpu.upload(&vec![f32::NAN; self.attn.data().len()])?, ATTN_TILE)?;
        self.q = gpu.upload(&vec![f32::NAN; self.q.len()])?;
        Ok(())
    }

    /// `out`, then the cache rows written at each sequence's position (k, then v), as f32.
    pub fn results(&self, gpu: &Gpu, step: &Step<T>) -> Result<Vec<f32>> {
        let mut values: Vec<f32> = gpu.download(&self.out)?.iter().map(|v| v.to_f32()).collect();
        let heads = step.heads();
        for cache in [&self.k_cache, &self.v_cache] {
            let cache = gpu.download(cache)?;
            for (s, &pos) in step.positions.iter().enumerate() {
                for head in 0..heads {
                    values.extend(cache[((s * heads + head) * step.max_len + pos) * HEAD_DIM..][..HEAD_DIM].iter().map(|v| v.to_f32()));
                }
            }
        }
        Ok(values)
    }
}

/// The fused variant on `stream`: [`DecodeType::attention`] then [`DecodeType::o_proj`],
/// with `programmatic` launched programmatically after it.
pub fn fused<T: DecodeType>(kernels: &T::Kernels, stream: &Stream, b: &mut Buffers<T>, cluster: u32, programmatic: bool) -> Result<()> {
    T::attention(kernels, stream, b, cluster)?;
    T::o_proj(kernels, stream, b, programmatic)
}

/// The spread variant on `stream` (batch 1): [`DecodeType::spread`].
pub fn spread<T: DecodeType>(kernels: &T::Kernels, stream: &Stream, b: &mut Buffers<T>, cluster: u32, programmatic: bool) -> Result<()> {
    T::spread(kernels, stream, b, cluster, programmatic)
}

/// The five separate kernels (f16, batch 1), loaded, with their f32 intermediates.
pub struct Separate {
    rms_norm: decode_rms_norm::Kernel,
    qkv: decode_qkv::Kernel,
    rope_append: decode_rope_append::Kernel,
    attend: decode_attend::Kernel,
    o_proj: decode_o_proj_f16::Kernel,
    xn: Buffer<f32>,
    qkv_out: Buffer<f32>,
    q: Buffer<f32>,
}

impl Separate {
    /// Loads the kernels and allocates the intermediates for `hidden`.
    pub fn load(gpu: &Gpu, hidden: usize) -> Result<Self> {
        Ok(Self {
            rms_norm: decode_rms_norm::load(gpu)?,
            qkv: decode_qkv::load(gpu)?,
            rope_append: decode_rope_append::load(gpu)?,
            attend: decode_attend::load(gpu)?,
            o_proj: decode_o_proj_f16::load(gpu)?,
            xn: gpu.upload(&vec![f32::NAN; hidden])?,
            qkv_out: gpu.upload(&vec![f32::NAN; 3 * hidden])?,
            q: gpu.upload(&vec![f32::NAN; hidden])?,
        })
    }

    /// The five launches on `s`, the attention with clusters of `cluster` blocks.
    pub fn launch(&mut self, s: &Stream, b: &mut Buffers<f16>, cluster: u32) -> Result<()> {
        assert_eq!(b.batch, 1, "the separate kernels run batch 1");
        let (h, heads, pos) = (b.hidden, b.hidden / HEAD_DIM, b.host_positions[0]);
        let rows_per_block = WARPS * QKV_ROWS;
        self.rms_norm.launch(s, &config(1, BLOCK, None, 0), &b.x, &b.norm_w, &mut self.xn)?;
        self.qkv.launch(s, &config(3 * h / rows_per_block, BLOCK, None, 4 * h), &self.xn, &b.w_qkv, &mut self.qkv_out)?;
        self.rope_append.launch(s, &config(heads, HEAD_DIM as u32, None, 0), &self.qkv_out, &b.rope, &mut self.q, &mut b.k_cache,
                                &mut b.v_cache, pos, b.max_len as u32)?;
        self.attend.launch(s, &config(heads * cluster as usize, BLOCK, Some(cluster), 0), &self.q, &b.k_cache, &b.v_cache,
                           b.attn.data_mut(), pos + 1, b.max_len as u32)?;
        self.o_proj.launch(s, &o_proj_config(h, 1), b.attn.data_mut(), &b.w_o, &b.x, &mut b.out, 1)
    }
}
