//! A layer on the host: shapes, random weights, the f64 reference, device buffers and the
//! launches.

use super::*;
use crate::uniform;
use clusterfuse::host::{Buffer, Error, Gpu, Published, Result, Stream, Swizzle, TensorMap};
use clusterfuse::limits::MAX_SHARED_MEMORY_PER_BLOCK;
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
        let c = cluster as usize;
        if !(2..=16).contains(&c) || !self.experts.is_multiple_of(c) {
            let reason = format!("{} experts over clusters of {cluster}: the cluster (2-16 blocks: the routing's mailbox needs peers) must divide the experts", self.experts);
            return Err(Error::UnsupportedShape { kernel: "the MoE layer", reason });
        }
        self.check_shape(tokens)
    }

    /// [`Layer::check`] without the cluster.
    fn check_shape(&self, tokens: usize) -> Result<()> {
        let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel: "the MoE layer", reason });
        if !(1..=MAX_TOKENS).contains(&tokens) {
            return unsupported(format!("{tokens} tokens: the kernels route 1 to {MAX_TOKENS}"));
        }
        if !(1..=MAX_TOP_K).contains(&self.top_k) || self.top_k > self.experts {
            return unsupported(format!("top {} of {} experts: k is 1 to {MAX_TOP_K}, at most the experts", self.top_k, self.experts));
        }
        if self.experts >= 1 << 16 {
            return unsupported(format!("{} experts: fewer than 65536", self.experts));
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
#[derive(Clone)]
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
        layer.check_shape(tokens)?;
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

    /// Whether the kernels take this layer: its shape ([`Layer::check`]'s, the cluster aside)
    /// and the length of every array. [`Buffers::upload`] checks it first: the kernels would
    /// otherwise trap on a length they do not expect, which ends the CUDA context.
    pub fn check(&self) -> Result<()> {
        self.layer.check_shape(self.tokens)?;
        let (t, Layer { hidden: h, experts: e, ffn: f, .. }) = (self.tokens, self.layer);
        let arrays = [
            ("x", self.x.len(), [t, h], ["tokens", "hidden"]),
            ("router", self.router.len(), [e, h], ["experts", "hidden"]),
            ("w_gate", self.w_gate.len(), [e * f, h], ["experts × FFN", "hidden"]),
            ("w_up", self.w_up.len(), [e * f, h], ["experts × FFN", "hidden"]),
            ("w_down", self.w_down.len(), [e * h, f], ["experts × hidden", "FFN"]),
        ];
        match arrays.into_iter().find(|&(_, len, [rows, cols], _)| len != rows * cols) {
            None => Ok(()),
            Some((name, len, [rows, cols], [r, c])) => {
                let reason = format!("`{name}` holds {len} values; {rows} rows ({r}) × {cols} ({c}) is {}", rows * cols);
                Err(Error::UnsupportedShape { kernel: "the MoE layer", reason })
            }
        }
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
    down_g8: moe_down_g8::Kernel,
    down_g16: moe_down_g16::Kernel,
    gate_up_tokens: moe_gate_up_tokens::Kernel,
    down_tokens: moe_down_tokens::Kernel,
    fused: moe_fused::Kernel,
}

impl Kernels {
    /// Loads them.
    pub fn load(gpu: &Gpu) -> Result<Self> {
        Ok(Kernels {
            gate_up_g8: moe_gate_up_g8::load(gpu)?,
            gate_up_g16: moe_gate_up_g16::load(gpu)?,
            gate_up_g32: moe_gate_up_g32::load(gpu)?,
            down_g8: moe_down_g8::load(gpu)?,
            down_g16: moe_down_g16::load(gpu)?,
            gate_up_tokens: moe_gate_up_tokens::load(gpu)?,
            down_tokens: moe_down_tokens::load(gpu)?,
            fused: moe_fused::load(gpu)?,
        })
    }
}

/// A step's buffers on a device: the inputs (expert weights [`tile`]d), the two kernels'
/// hand-over, poisoned outputs, and the tensor maps the tokens schedule loads through.
pub struct Buffers {
    layer: Layer,
    tokens: usize,
    x: Buffer<bf16>,
    router: Buffer<bf16>,
    w_gate: Buffer<bf16>,
    w_up: Buffer<bf16>,
    w_down: Buffer<bf16>,
    /// `tokens · top_k × ffn`: the pairs' activations (the pairs schedule).
    h: Buffer<bf16>,
    /// `tokens × experts · ffn`: each token's gated activations for every selected expert
    /// (the tokens schedule).
    h_tokens: Buffer<bf16>,
    /// Each expert's pair count, then the pairs' tokens.
    routing: Buffer<u32>,
    pair_gate: Buffer<f32>,
    /// `tokens × top_k`.
    top_ids: Buffer<u32>,
    top_gates: Buffer<f32>,
    /// `tokens × hidden`.
    out: Buffer<bf16>,
    /// [`MAX_TOKENS`] `× experts`: every token's gate weight for each expert, published
    /// by the tokens schedules' routing clusters.
    gate_table: Published<f32>,
    /// The fused schedule's partial `y` of each block (`tokens × hidden` a tile, a tile an
    /// SM and for the last cluster's rounding; one tile past [`FUSED_MAX_TOKENS`] tokens,
    /// where the schedule does not run).
    partials: Published<f32>,
    maps: Maps,
    /// The two kernels' timelines ([`TIMELINE_POINTS`] a block; one value: off).
    timelines: [Buffer<u64>; 2],
    /// The last launch on these buffers was the down kernel's. Only then may a gate/up
    /// launch overlap what runs before it: the gate/up kernel reads `gate_table`'s epoch
    /// before it waits, and a down kernel lets its dependents start only once the gate/up
    /// kernel before it (which advances that epoch as it ends) has completed.
    after_down: bool,
}

/// The tokens schedule's tensor maps: `x` and `h_tokens` in boxes of 64 rows (every
/// token, zeros past the last) × a stage's columns, the tiled weights in boxes of 8 row
/// tiles × a stage's K-steps (`load_weights`). Detached from the
/// buffers they describe, which [`Buffers`] owns and never replaces without making the
/// maps again.
struct Maps {
    x: TensorMap<'static>,
    w_gate: TensorMap<'static>,
    w_up: TensorMap<'static>,
    w_down: TensorMap<'static>,
    h_tokens: TensorMap<'static>,
}

impl Maps {
    /// The maps of `x`, the tiled weights and `h_tokens`, for `tokens` tokens of `layer`.
    fn new(gpu: &Gpu, layer: Layer, tokens: usize, [x, w_gate, w_up, w_down, h_tokens]: [&Buffer<bf16>; 5]) -> Result<Self> {
        // SAFETY (both): `Buffers` owns every tensor, frees none while a launch or graph
        // that takes the maps may run (both borrow `Buffers`), and makes the maps again
        // whenever it replaces one (`poison`).
        // Boxes of 64 tokens × `steps` K-steps (`tokens_operand`).
        let rows = |t: &Buffer<bf16>, cols: usize, steps: usize| -> Result<TensorMap<'static>> {
            let swizzle = if steps == 1 { Swizzle::B64 } else { Swizzle::B128 };
            unsafe { Ok(gpu.tensor_map_2d(t, (tokens, cols), (MAX_TOKENS as u32, (steps * STEP) as u32), swizzle)?.detach()) }
        };
        // Each row tile a plane of rows of 64 (`load_weights`), `cols` of them a row.
        let tiles = |w: &Buffer<bf16>, cols: usize, steps: usize| -> Result<TensorMap<'static>> {
            let shape = (w.len() / (ROWS * cols), ROWS * cols / (2 * STEP), 2 * STEP);
            let boxes = (TILE_ROW_TILES as u32, (steps * ROWS / 2) as u32, 2 * STEP as u32);
            unsafe { Ok(gpu.tensor_map_3d(w, shape, boxes, Swizzle::B128)?.detach()) }
        };
        let (hidden, ffn, g, d) = (layer.hidden, layer.ffn, GATE_UP_STAGE_STEPS, DOWN_STAGE_STEPS);
        Ok(Maps {
            x: rows(x, hidden, g)?,
            w_gate: tiles(w_gate, hidden, g)?,
            w_up: tiles(w_up, hidden, g)?,
            w_down: tiles(w_down, ffn, d)?,
            h_tokens: rows(h_tokens, layer.experts * ffn, d)?,
        })
    }
}

/// A step's hand-over (`h`, `h_tokens`, `routing`, `pair_gate`), output (`top_ids`,
/// `top_gates`, `out`) and published (`gate_table`, `partials`) buffers, in [`Buffers`]' order.
type Poisoned = (Buffer<bf16>, Buffer<bf16>, Buffer<u32>, Buffer<f32>, Buffer<u32>, Buffer<f32>, Buffer<bf16>, Published<f32>, Published<f32>);

/// Those buffers for `tokens` tokens of `layer`, poisoned: NaN, or `u32::MAX`.
fn poisoned(gpu: &Gpu, layer: Layer, tokens: usize) -> Result<Poisoned> {
    let pairs = tokens * layer.top_k;
    let nan = bf16::from_f32(f32::NAN);
    Ok((
        gpu.upload(&vec![nan; pairs * layer.ffn])?,
        gpu.upload(&vec![nan; tokens * layer.experts * layer.ffn])?,
        gpu.upload(&vec![u32::MAX; layer.experts + pairs])?,
        gpu.upload(&vec![f32::NAN; pairs])?,
        gpu.upload(&vec![u32::MAX; pairs])?,
        gpu.upload(&vec![f32::NAN; pairs])?,
        gpu.upload(&vec![nan; tokens * layer.hidden])?,
        // In tiles of a dense routing cluster's tokens.
        Published::new(gpu, gpu.upload(&vec![f32::NAN; MAX_TOKENS * layer.experts])?, (ROUTER_TOKENS * layer.experts) as u32)?,
        {
            // A tile a block: an SM's, rounded up to whole clusters (of at most 16).
            let (tile, tiles) = (tokens * layer.hidden, if tokens <= FUSED_MAX_TOKENS { multiprocessors(gpu)?.next_multiple_of(16) } else { 1 });
            Published::new(gpu, gpu.upload(&vec![f32::NAN; tiles * tile])?, tile as u32)?
        },
    ))
}

impl Buffers {
    /// Uploads `moe`, with every output and hand-over buffer poisoned; refuses a layer the
    /// kernels do not take ([`Moe::check`]).
    pub fn upload(gpu: &Gpu, moe: &Moe) -> Result<Self> {
        moe.check()?;
        let Layer { hidden, ffn, .. } = moe.layer;
        let (h, h_tokens, routing, pair_gate, top_ids, top_gates, out, gate_table, partials) = poisoned(gpu, moe.layer, moe.tokens)?;
        let x = gpu.upload(&moe.x)?;
        let w_gate = gpu.upload(&tile(&moe.w_gate, hidden))?;
        let w_up = gpu.upload(&tile(&moe.w_up, hidden))?;
        let w_down = gpu.upload(&tile(&moe.w_down, ffn))?;
        let maps = Maps::new(gpu, moe.layer, moe.tokens, [&x, &w_gate, &w_up, &w_down, &h_tokens])?;
        Ok(Buffers {
            layer: moe.layer,
            tokens: moe.tokens,
            x,
            router: gpu.upload(&moe.router)?,
            w_gate,
            w_up,
            w_down,
            h,
            h_tokens,
            routing,
            pair_gate,
            top_ids,
            top_gates,
            out,
            gate_table,
            partials,
            maps,
            timelines: [gpu.upload(&[0u64])?, gpu.upload(&[0u64])?],
            after_down: false,
        })
    }

    /// Poisons the outputs and the hand-over again (new buffers, and their maps). On an
    /// error nothing is replaced: the maps never outlive the buffers they describe.
    pub fn poison(&mut self, gpu: &Gpu) -> Result<()> {
        let buffers = poisoned(gpu, self.layer, self.tokens)?;
        let maps = Maps::new(gpu, self.layer, self.tokens, [&self.x, &self.w_gate, &self.w_up, &self.w_down, &buffers.1])?;
        (self.h, self.h_tokens, self.routing, self.pair_gate, self.top_ids, self.top_gates, self.out, self.gate_table, self.partials) = buffers;
        self.maps = maps;
        Ok(())
    }

    /// `y` (as f32), the chosen experts and their gate weights.
    pub fn results(&self, gpu: &Gpu) -> Result<(Vec<f32>, Vec<u32>, Vec<f32>)> {
        let out = gpu.download(&self.out)?.iter().map(|v| v.to_f32()).collect();
        Ok((out, gpu.download(&self.top_ids)?, gpu.download(&self.top_gates)?))
    }

    /// Makes the launches of `plan` stamp their blocks' timelines, which
    /// [`Buffers::timeline`] reads. It replaces two buffers, as [`Buffers::poison`] does: a
    /// graph captured before must not be replayed after.
    pub fn record_timeline(&mut self, gpu: &Gpu, plan: &Plan) -> Result<()> {
        let stamps = |config: Option<&LaunchConfig>| config.map_or(vec![0u64], |c| vec![0u64; c.grid.x as usize * TIMELINE_POINTS]);
        self.timelines = [gpu.upload(&stamps(Some(&plan.gate_up)))?, gpu.upload(&stamps(plan.down.as_ref()))?];
        // The timeline's origin is the first gate/up block's start: in stream order.
        self.after_down = false;
        Ok(())
    }

    /// Where the last step's time went, from the timelines [`Buffers::record_timeline`]
    /// turned on for `plan` (`None` while they are off).
    pub fn timeline(&self, gpu: &Gpu, plan: &Plan) -> Result<Option<Timeline>> {
        if self.timelines[0].len() == 1 {
            return Ok(None);
        }
        let gate_up = gpu.download(&self.timelines[0])?;
        let down = plan.down.map(|_| gpu.download(&self.timelines[1])).transpose()?;
        let cluster = plan.gate_up.cluster.map_or(1, |c| c.x as usize);
        Ok(Some(Timeline::new(&gate_up, down.as_deref(), cluster)))
    }
}

/// Where a step's time went, in µs from the first gate/up block's start (`%globaltimer`
/// stamps of every block, [`TIMELINE_POINTS`]): means over the blocks that stamp a point
/// (on the dense schedule only the routing cluster's stamp the router logits), and the
/// last block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timeline {
    /// Gate/up blocks (the fused schedule's: the step's): their start, router logits summed,
    /// routing ready (mean), end (last).
    pub gate_up: [f64; TIMELINE_POINTS],
    /// The router logits of each cluster's last block, the mean over clusters: when the
    /// cluster's routing can start.
    pub cluster_logits: f64,
    /// Down blocks: their start (mean), routing received (mean), end (last); none on the
    /// fused schedule (one launch).
    pub down: Option<[f64; 3]>,
    /// Every block of both kernels stamped its points in order: its raw stamps, not the
    /// means above (the mean of the clusters' last logits and that of all blocks' logits
    /// are sums of different lengths, which can round apart when the stamps are equal).
    pub in_order: bool,
}

impl Timeline {
    /// From the kernels' stamps (the down kernel's, where the step has one), the gate/up
    /// kernel's in clusters of `cluster` blocks.
    fn new(gate_up: &[u64], down: Option<&[u64]>, cluster: usize) -> Self {
        let origin = gate_up.chunks(TIMELINE_POINTS).map(|b| b[0]).min().unwrap_or(0);
        // The stamps blocks made at `point`, in µs from the origin (0: not stamped).
        fn stamped(stamps: &[u64], point: usize, origin: u64) -> impl Iterator<Item = f64> + '_ {
            stamps.chunks(TIMELINE_POINTS).map(move |b| b[point]).filter(|&t| t != 0).map(move |t| t.saturating_sub(origin) as f64 / 1e3)
        }
        fn average(values: impl Iterator<Item = f64>) -> f64 {
            let (sum, n) = values.fold((0.0, 0), |(sum, n), v| (sum + v, n + 1));
            sum / n.max(1) as f64
        }
        let point = |stamps: &[u64], point: usize| average(stamped(stamps, point, origin));
        let last = |stamps: &[u64]| stamped(stamps, 3, origin).fold(0.0, f64::max);
        let cluster_logits = average(gate_up.chunks(TIMELINE_POINTS * cluster).filter_map(|c| stamped(c, 1, origin).reduce(f64::max)));
        let in_order = |stamps: &[u64]| stamps.chunks(TIMELINE_POINTS).all(|b| b.iter().filter(|&&t| t != 0).is_sorted());
        Timeline {
            gate_up: [point(gate_up, 0), point(gate_up, 1), point(gate_up, 2), last(gate_up)],
            cluster_logits,
            down: down.map(|down| [point(down, 0), point(down, 2), last(down)]),
            in_order: in_order(gate_up) && down.is_none_or(in_order),
        }
    }
}

#[cfg(test)]
mod timeline_tests {
    use super::Timeline;

    /// Blocks of 4 stamps (start, logits, routing, end; 0: not stamped) for the gate/up
    /// kernel, every block stamping `at` plus its point's offset.
    fn gate_up(blocks: usize, at: u64) -> Vec<u64> {
        (0..blocks).flat_map(|_| [at, at + 1400, at + 11300, at + 37900]).collect()
    }

    #[test]
    fn equal_stamps_are_in_order_though_their_means_round_apart() {
        let (gate_up, down) = (gate_up(8, 1_000), vec![2_000, 0, 3_000, 4_000]);
        let timeline = Timeline::new(&gate_up, Some(&down), 2);
        assert!(timeline.in_order);
        // The check this replaced: the mean of the clusters' last logits against the mean
        // of all blocks' (sums of 4 and of 8 equal values) rounds apart.
        assert!(timeline.cluster_logits < timeline.gate_up[1], "{timeline:?}");
    }

    #[test]
    fn a_block_stamped_out_of_order_is_caught() {
        let mut gate_up = gate_up(4, 1_000);
        gate_up.swap(5, 6);
        assert!(!Timeline::new(&gate_up, Some(&[2_000, 0, 3_000, 4_000]), 2).in_order);
        assert!(!Timeline::new(&self::gate_up(4, 1_000), Some(&[2_000, 0, 4_000, 3_000]), 2).in_order);
        assert!(!Timeline::new(&gate_up, None, 2).in_order);
    }
}

/// How a step's two kernels share the work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Schedule {
    /// The (token, expert) pairs, grouped by expert, on `mma.sync` warps that stream the
    /// weights through registers ([`fn@moe_gate_up_g8`] …, [`fn@moe_down_g8`] …): each
    /// expert's rows are read once per group of pairs it serves. For few tokens.
    Pairs {
        /// Pairs an expert's pass over its weights serves in the gate/up kernel: 8 (the
        /// staged schedule), 16 or 32 (a unit a warp).
        gate_up_group: usize,
        /// The same in the down kernel: 8 or 16.
        down_group: usize,
    },
    /// Every token against each selected expert on `wgmma`, the weights through a TMA
    /// pipeline ([`fn@moe_gate_up_tokens`], [`fn@moe_down_tokens`]): each expert's rows read
    /// once, whatever its share of the tokens. For many tokens.
    Tokens,
    /// The tokens schedule over *every* expert, so that the gate and up projections need
    /// no routing to start: a few clusters route 8 tokens each while the other blocks
    /// stream, and publish the gate weights the epilogues apply (zero for an expert no
    /// token chose); the down kernel needs no routing at all. For so many tokens that
    /// every expert is chosen anyway ([`DENSE_PAIRS_PER_EXPERT`]).
    Dense,
    /// One launch ([`fn@moe_fused`]): the tokens schedule's routing and gate/up units, each
    /// unit then multiplying its own 128 features of `h` by the same 128 columns of its
    /// expert's `W_down` (the down projection split along the features, so that no block
    /// waits for another's `h`), the blocks' partial outputs summed in block order at the
    /// end. For few tokens (at most [`FUSED_MAX_TOKENS`], its partial output in shared
    /// memory).
    Fused,
}

/// How a step launches: the schedule and both launch configurations.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub schedule: Schedule,
    /// The first launch (the fused schedule's only one).
    pub gate_up: LaunchConfig,
    /// The down launch; none on the fused schedule.
    pub down: Option<LaunchConfig>,
}

/// The schedule [`plan`] takes for `tokens` tokens on a GPU of `sms` multiprocessors:
/// where the layer allows the tokens schedule, the dense one from
/// [`DENSE_PAIRS_PER_EXPERT`] pairs an expert on (its gate/up blocks stream from the
/// start, none waits for the routing); where the experts it can select have fewer 128-row
/// units than the GPU has SMs (then fewer SMs stream than the GPU has, each more than its
/// share of the bytes, which the tokens schedule's deeper pipeline pulls faster) or the step
/// has one token, the fused schedule where it fits (no second launch streams the down
/// weights after the first has drained); with few units where it does not, the tokens one;
/// the tokens schedule too where the step has at least [`TOKENS_SCHEDULE_PAIRS`] pairs (the pairs schedule's groups get
/// large, and reread `x` from L2 per 16 rows) and the routing at most
/// [`TOKENS_SCHEDULE_LOGITS`] logits (every one of its blocks routes the whole step); the
/// pairs schedule otherwise. Fit to the H200's side-by-side runs (results/moe-h200.md,
/// sessions 30-34, 45 and 49): the tokens schedule won Mixtral at 64 tokens and DeepSeek at 8
/// and 1 (88 units), lost Mixtral at 8 (16 pairs) and 1 (224 units) and DeepSeek at 64 (4096
/// logits); the fused one beat it at one DeepSeek token by 9-12%, and the pairs one at one
/// Mixtral token by 3-4% (224 units, 132 blocks), but lost to the pairs one at 2 tokens of
/// either layer (176 and 448 units).
pub fn schedule(layer: &Layer, tokens: usize, sms: usize) -> Schedule {
    let (pairs, logits) = (tokens * layer.top_k, tokens * layer.experts);
    let few_units = gate_up_blocks(layer, tokens, Schedule::Tokens) < sms;
    match tokens_schedule_fits(layer) {
        Ok(()) if pairs >= DENSE_PAIRS_PER_EXPERT * layer.experts => Schedule::Dense,
        Ok(()) if (few_units || tokens == 1) && fused_fits(layer, tokens) => Schedule::Fused,
        Ok(()) if (pairs >= TOKENS_SCHEDULE_PAIRS && logits <= TOKENS_SCHEDULE_LOGITS) || few_units => Schedule::Tokens,
        _ => Schedule::pairs(layer, tokens),
    }
}

impl Schedule {
    /// The pairs schedule for `tokens` tokens: groups of about twice an expert's average
    /// share of the pairs (all tokens, at most) — 8, 16 or 32, the down kernel's at most 16.
    pub fn pairs(layer: &Layer, tokens: usize) -> Schedule {
        let share = tokens.min(2 * tokens * layer.top_k / layer.experts);
        let group = [8, 16, 32].into_iter().find(|&g| g >= share).unwrap_or(32);
        Schedule::Pairs { gate_up_group: group, down_group: group.min(16) }
    }
}

/// Fewest pairs an expert (`tokens · top_k / experts`) for which [`plan`] takes the dense
/// schedule: an expert then goes unchosen with probability below `e^−4` (2%) under
/// uniform routing, `(1 − top_k / experts)^tokens`, so streaming every expert costs
/// little more than the selected ones.
pub const DENSE_PAIRS_PER_EXPERT: usize = 4;
/// Fewest pairs (`tokens · top_k`) for which [`plan`] takes the tokens schedule.
pub const TOKENS_SCHEDULE_PAIRS: usize = 64;
/// Most router logits (`tokens · experts`) for which [`plan`] takes the tokens schedule.
pub const TOKENS_SCHEDULE_LOGITS: usize = 1024;

/// Whether the tokens schedule runs `layer`: FFN and hidden sizes in whole 128-row tiles.
fn tokens_schedule_fits(layer: &Layer) -> Result<()> {
    if layer.ffn.is_multiple_of(TILE_ROWS) && layer.hidden.is_multiple_of(TILE_ROWS) {
        return Ok(());
    }
    Err(Error::UnsupportedShape {
        kernel: "the MoE layer's tokens schedule",
        reason: format!("hidden {} and FFN {}: both must be multiples of {TILE_ROWS}", layer.hidden, layer.ffn),
    })
}

/// Shared memory of the routing in a gate/up (or fused) kernel: its arrays (the normalisers
/// counted even where the gating renormalises), 16-byte aligned each.
fn routing_smem(layer: &Layer, tokens: usize, cluster: usize) -> usize {
    let (pairs, e) = (tokens * layer.top_k, layer.experts);
    let partials = WARPS * ROWS * tokens.next_multiple_of(8) * 4;
    let sizes = [tokens * e / cluster * 4, partials, tokens * 4, mailbox_words(tokens, e, cluster, layer.top_k) * 8, 8, pairs * 8, pairs * 4, pairs * 4, 2 * e * 4];
    sizes.iter().map(|b| b.next_multiple_of(16)).sum::<usize>() + dispatch_smem(layer, tokens)
}

/// Shared memory of the fused kernel beside its routing: the tokens schedule's pipeline (9
/// stages ran no faster than 7 at one DeepSeek token: results/moe-h200.md, session 45), the
/// `h` tile, the block's partial `y`.
fn fused_smem(layer: &Layer, tokens: usize) -> usize {
    pipeline_smem(GATE_UP_TOKENS_STAGES, GATE_UP_TOKENS_STAGE_BYTES) + 2 * FUSED_H_BOX_BYTES as usize + (tokens * layer.hidden * 4).next_multiple_of(16)
}

/// Whether the fused schedule runs `layer` at `tokens` tokens: at most [`FUSED_MAX_TOKENS`],
/// the tokens schedule's shapes, and its shared memory within a block's (with the routing's
/// largest, in clusters of 2).
fn fused_fits(layer: &Layer, tokens: usize) -> bool {
    let smem = routing_smem(layer, tokens, 2) + fused_smem(layer, tokens);
    tokens <= FUSED_MAX_TOKENS && tokens_schedule_fits(layer).is_ok() && smem <= MAX_SHARED_MEMORY_PER_BLOCK as usize
}

/// Shared memory of a tokens-schedule pipeline: 1024 bytes to align the stages, the
/// stages, their barriers.
fn pipeline_smem(stages: usize, stage_bytes: u32) -> usize {
    1024 + stages * stage_bytes as usize + 16 * stages
}

/// Shared memory of the tokens schedule's down kernel: its pipeline, the block's tile of
/// `y`, the routing.
fn down_tokens_smem(layer: &Layer, tokens: usize) -> usize {
    pipeline_smem(DOWN_TOKENS_STAGES, DOWN_TOKENS_STAGE_BYTES) + (TILE_ROWS * tokens * 4).next_multiple_of(16) + dispatch_smem(layer, tokens)
}

fn dispatch_smem(layer: &Layer, tokens: usize) -> usize {
    let pairs = tokens * layer.top_k;
    [layer.experts * 4, layer.experts * 4, pairs * 4, pairs * 4, (pairs + 1) * 4].iter().map(|b| b.next_multiple_of(16)).sum()
}

/// The SMs [`plan`] plans for: the GPU's, or on the emulator the H200's 132.
pub fn multiprocessors(gpu: &Gpu) -> Result<usize> {
    Ok(gpu.multiprocessors()?.unwrap_or(132))
}

/// The launches of `layer` at `tokens` tokens on the [`schedule`] it takes, gate/up in
/// clusters of [`gate_up_cluster`] blocks; with `programmatic`, the down kernel launched
/// programmatically after the gate/up kernel, and on the tokens schedule the gate/up kernel
/// after the previous step's down kernel (its blocks start on the SMs that kernel leaves).
pub fn plan(kernels: &Kernels, gpu: &Gpu, layer: Layer, tokens: usize, programmatic: bool) -> Result<Plan> {
    let schedule = schedule(&layer, tokens, multiprocessors(gpu)?);
    plan_schedule(kernels, gpu, layer, tokens, gate_up_cluster(kernels, gpu, layer, tokens, schedule)?, programmatic, schedule)
}

/// The gate/up kernel's cluster for `schedule`: of 2 blocks where the step has a block's
/// work for every SM (clusters of 2 fill every SM, 132 blocks on the H200, where clusters
/// of 4 fill 120: a GPC holds whole clusters), else of 4 where they still hold every block
/// the step wants (the stream has SMs to spare, and each block computes half as many
/// experts' logits, so the routing is faster), else of 2. Fit to the H200's runs
/// (results/moe-h200.md, session 34): clusters of 2 against 4 sped Mixtral's steps up
/// by 3-6% and DeepSeek's 8-token one by 2 points of its roofline, and slowed DeepSeek's
/// 1-token step (88-100 blocks) by 7-13%; clusters of 8 ran that one 4-5% slower than 4.
pub fn gate_up_cluster(kernels: &Kernels, gpu: &Gpu, layer: Layer, tokens: usize, schedule: Schedule) -> Result<u32> {
    let wanted = gate_up_blocks(&layer, tokens, schedule);
    let spare_sms = wanted < multiprocessors(gpu)?;
    if spare_sms && layer.check(tokens, 4).is_ok() && gate_up_launch(kernels, gpu, &layer, tokens, 4, schedule)?.1 >= wanted as u64 {
        return Ok(4);
    }
    Ok(2)
}

/// Blocks the gate/up kernel wants on `schedule` (before the GPU's limit): on the pairs
/// schedule one per 8 units (16 rows of an item) of the largest routing with groups of 8,
/// a unit a warp, or per 2 units with 16 and 32; on the tokens schedule one per unit (128
/// rows of a selected expert); on the dense one one per unit of every expert.
fn gate_up_blocks(layer: &Layer, tokens: usize, schedule: Schedule) -> usize {
    // The most experts a routing can select.
    let selected = layer.experts.min(tokens * layer.top_k);
    match schedule {
        Schedule::Pairs { gate_up_group: group, .. } => {
            let units = selected * layer.ffn / ROWS + tokens * layer.top_k / group * layer.ffn / ROWS;
            units.div_ceil(if group == 8 { WARPS } else { 2 })
        }
        Schedule::Tokens | Schedule::Fused => selected * layer.ffn / TILE_ROWS,
        Schedule::Dense => layer.experts * layer.ffn / TILE_ROWS,
    }
}

/// The gate/up kernel on `schedule` in clusters of `cluster`: its launch (grid of one
/// cluster) and how many of its blocks the GPU holds at once.
fn gate_up_launch(kernels: &Kernels, gpu: &Gpu, layer: &Layer, tokens: usize, cluster: u32, schedule: Schedule) -> Result<(LaunchConfig, u64)> {
    // Beside the routing: with groups of 8 the staged window of the pairs' `x`, on the tokens
    // schedules their pipeline.
    let (raw, beside) = match schedule {
        Schedule::Pairs { gate_up_group: 8, .. } => (kernels.gate_up_g8.raw(), (8 * padded_row_words(window_columns(layer.hidden)) * 4).next_multiple_of(16)),
        Schedule::Pairs { gate_up_group: 16, .. } => (kernels.gate_up_g16.raw(), 0),
        Schedule::Pairs { .. } => (kernels.gate_up_g32.raw(), 0),
        Schedule::Tokens | Schedule::Dense => (kernels.gate_up_tokens.raw(), pipeline_smem(GATE_UP_TOKENS_STAGES, GATE_UP_TOKENS_STAGE_BYTES)),
        Schedule::Fused => (kernels.fused.raw(), fused_smem(layer, tokens)),
    };
    let smem = routing_smem(layer, tokens, cluster as usize) + beside;
    let config = LaunchConfig { grid: cluster.into(), block: BLOCK.into(), cluster: Some(cluster.into()), dynamic_smem_bytes: smem as u32, ..LaunchConfig::default() };
    let resident = raw.max_resident_blocks(gpu.stream(), &raw.plan(&config)?)?;
    Ok((config, resident))
}

/// The launches of `layer` at `tokens` tokens on `schedule`, gate/up in clusters of
/// `cluster`: as many gate/up blocks as the GPU holds at once, at most as many as the step
/// wants (`gate_up_blocks`; dense, at least a cluster for each 8 tokens to route). The
/// down kernel: on the pairs schedule a cluster per 16 output
/// rows, of as many blocks (1, 2 or 4, splitting K) as keep the grid within two blocks per
/// SM; on the others a cluster per 128 output rows, of as many blocks (1-8, splitting K)
/// as the GPU holds all at once.
#[allow(clippy::too_many_arguments)]
pub fn plan_schedule(kernels: &Kernels, gpu: &Gpu, layer: Layer, tokens: usize, cluster: u32, programmatic: bool, schedule: Schedule) -> Result<Plan> {
    layer.check(tokens, cluster)?;
    let c = cluster as usize;
    let sms = multiprocessors(gpu)?;
    let down_raw = match schedule {
        Schedule::Pairs { gate_up_group, down_group } => {
            if ![8, 16, 32].contains(&gate_up_group) || ![8, 16].contains(&down_group) {
                return Err(Error::UnsupportedShape { kernel: "the MoE layer", reason: format!("groups of {gate_up_group} and {down_group} pairs: the kernels take 8, 16 or 32, and 8 or 16") });
            }
            Some(if down_group == 8 { kernels.down_g8.raw() } else { kernels.down_g16.raw() })
        }
        Schedule::Tokens | Schedule::Dense => {
            tokens_schedule_fits(&layer)?;
            Some(kernels.down_tokens.raw())
        }
        Schedule::Fused => {
            tokens_schedule_fits(&layer)?;
            if tokens > FUSED_MAX_TOKENS {
                let reason = format!("{tokens} tokens: it takes at most {FUSED_MAX_TOKENS} (a block's partial output sits in its shared memory)");
                return Err(Error::UnsupportedShape { kernel: "the MoE layer's fused schedule", reason });
            }
            None
        }
    };
    let (mut gate_up, resident) = gate_up_launch(kernels, gpu, &layer, tokens, cluster, schedule)?;
    // The tokens schedule's gate/up kernel after the previous step's down kernel as well:
    // measured on an H100 (results/moe-h200.md, session 43), it took 1.1-1.9 µs off the
    // 1-token DeepSeek step (67.2 µs against 68.3-69.1 in a CUDA graph) and left 8 tokens
    // level; on the pairs schedule it slowed that step's two plain launches by 12% (81.4
    // µs against 72.4), and the dense one was not measured: both keep stream order.
    gate_up.programmatic = programmatic && schedule == Schedule::Tokens;
    // Dense: a cluster for each group of tokens to route.
    let wanted = gate_up_blocks(&layer, tokens, schedule).max(if schedule == Schedule::Dense { tokens.div_ceil(ROUTER_TOKENS) * c } else { 0 });
    // Fused: a block an SM at most, whatever the device holds (its partial outputs' tiles).
    let most = if schedule == Schedule::Fused { resident.min(sms as u64) } else { resident };
    gate_up.grid = ((wanted as u64).min(most).max(1).div_ceil(c as u64) as u32 * cluster).into();
    let routers = tokens.div_ceil(ROUTER_TOKENS) as u32;
    if schedule == Schedule::Dense && gate_up.grid.x / cluster < routers {
        let reason = format!("{} clusters of {cluster} fit at once, fewer than the {routers} that route {tokens} tokens", gate_up.grid.x / cluster);
        return Err(Error::UnsupportedShape { kernel: "the MoE layer's dense schedule", reason });
    }
    let Some(down_raw) = down_raw else { return Ok(Plan { schedule, gate_up, down: None }) };

    // The down kernel's clusters split K, so that its blocks fill the GPU: the pairs
    // schedule's loop over their row tiles (a cluster that fits is enough), the tokens
    // schedule's take one each (the whole grid must fit at once).
    let (tile_rows, splits, per_sm, smem) = match schedule {
        Schedule::Pairs { .. } => (ROWS, &[4, 2][..], 2, dispatch_smem(&layer, tokens) + (WARPS * ROWS * tokens * 4).next_multiple_of(16) + ROWS * tokens * 4),
        // The tokens and dense schedules (the fused one has returned: no down launch).
        _ => (TILE_ROWS, &[8, 7, 6, 5, 4, 3, 2][..], 1, down_tokens_smem(&layer, tokens)),
    };
    let row_tiles = layer.hidden / tile_rows;
    let config = |split: usize| LaunchConfig {
        grid: ((row_tiles * split) as u32).into(),
        block: BLOCK.into(),
        cluster: Some((split as u32).into()),
        dynamic_smem_bytes: smem as u32,
        programmatic,
        ..LaunchConfig::default()
    };
    // The largest such cluster the GPU can hold (a residency query that fails counts as no).
    let mut down = config(1);
    let needed = |split: usize| if matches!(schedule, Schedule::Pairs { .. }) { split } else { row_tiles * split } as u64;
    for &split in splits.iter().filter(|&&p| row_tiles * p <= per_sm * sms) {
        if down_raw.max_resident_blocks(gpu.stream(), &down_raw.plan(&config(split))?).is_ok_and(|blocks| blocks >= needed(split)) {
            down = config(split);
            break;
        }
    }
    Ok(Plan { schedule, gate_up, down: Some(down) })
}

/// One step on `stream`: the launches of `plan`.
pub fn step(kernels: &Kernels, stream: &Stream, b: &mut Buffers, plan: &Plan) -> Result<()> {
    gate_up(kernels, stream, b, plan)?;
    down(kernels, stream, b, plan)
}

/// The first launch alone: routing, gate and up projections (on the fused schedule the whole
/// step) — programmatic as `plan` says where the last launch on `b` was [`down`]'s, else in
/// stream order.
pub fn gate_up(kernels: &Kernels, stream: &Stream, b: &mut Buffers, plan: &Plan) -> Result<()> {
    let (k, renormalize) = (b.layer.top_k as u32, u32::from(b.layer.renormalize));
    let config = LaunchConfig { programmatic: plan.gate_up.programmatic && b.after_down, ..plan.gate_up };
    b.after_down = false;
    macro_rules! launch {
        ($kernel:expr) => {
            $kernel.launch(stream, &config, &b.x, &b.router, &b.w_gate, &b.w_up, &mut b.h, &mut b.routing, &mut b.pair_gate, &mut b.top_ids, &mut b.top_gates, k, renormalize, &mut b.timelines[0])
        };
    }
    match plan.schedule {
        Schedule::Pairs { gate_up_group: 8, .. } => launch!(kernels.gate_up_g8),
        Schedule::Pairs { gate_up_group: 16, .. } => launch!(kernels.gate_up_g16),
        Schedule::Pairs { .. } => launch!(kernels.gate_up_g32),
        Schedule::Tokens | Schedule::Dense => {
            let m = &b.maps;
            kernels.gate_up_tokens.launch(
                stream,
                &config,
                &b.x,
                m.x.words(),
                &b.router,
                &b.w_gate,
                m.w_gate.words(),
                &b.w_up,
                m.w_up.words(),
                &mut b.h_tokens,
                &mut b.routing,
                &mut b.pair_gate,
                &mut b.top_ids,
                &mut b.top_gates,
                k,
                renormalize,
                u32::from(plan.schedule == Schedule::Dense),
                &mut b.gate_table,
                &mut b.timelines[0],
            )
        }
        Schedule::Fused => {
            let m = &b.maps;
            kernels.fused.launch(
                stream,
                &config,
                &b.x,
                m.x.words(),
                &b.router,
                &b.w_gate,
                m.w_gate.words(),
                &b.w_up,
                m.w_up.words(),
                &b.w_down,
                m.w_down.words(),
                &mut b.out,
                &mut b.top_ids,
                &mut b.top_gates,
                k,
                renormalize,
                &mut b.partials,
                &mut b.timelines[0],
            )
        }
    }
}

/// The second launch alone: the down projection and the combine, reading what the last
/// [`gate_up`] on `b` wrote; nothing where `plan` has no down launch (the fused schedule).
pub fn down(kernels: &Kernels, stream: &Stream, b: &mut Buffers, plan: &Plan) -> Result<()> {
    let Some(config) = &plan.down else { return Ok(()) };
    let k = b.layer.top_k as u32;
    macro_rules! launch {
        ($kernel:expr) => {
            $kernel.launch(stream, config, &mut b.h, &mut b.routing, &mut b.pair_gate, &b.w_down, &mut b.out, k, &mut b.timelines[1])
        };
    }
    match plan.schedule {
        Schedule::Pairs { down_group: 8, .. } => launch!(kernels.down_g8),
        Schedule::Pairs { .. } => launch!(kernels.down_g16),
        Schedule::Tokens | Schedule::Dense | Schedule::Fused => {
            let m = &b.maps;
            let dense = u32::from(plan.schedule == Schedule::Dense);
            kernels.down_tokens.launch(stream, config, &mut b.h_tokens, m.h_tokens.words(), &mut b.routing, &mut b.pair_gate, &b.w_down, m.w_down.words(), &mut b.out, k, dense, &mut b.timelines[1])
        }
    }?;
    b.after_down = true;
    Ok(())
}
