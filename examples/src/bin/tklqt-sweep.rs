//! TKLQT over batch sizes: a 12-layer stack of small kernels, as a framework launches them
//! (per layer: residual add → RMSNorm, a saxpy, a row softmax over attention-sized rows, bias
//! add → LayerNorm → GELU; 7 launches, hidden 4096, 64 tokens per batch element), recorded
//! with the launch recorder at batch sizes 1-64. For each batch: 3 passes, each ended by a
//! synchronisation, recorded once to warm up and once for the trace.
//!
//! Writes one trace per batch (`tklqt-bNN.jsonl`, readable by `clusterfuse-trace`) and the
//! plots (`tklqt.svg`, `latency.svg`) to the output folder, prints the summary and sweep
//! tables (CPU- or GPU-bound per batch, and the transition) and the fusion advice at batch 1.
//! Progress goes to stderr. Without a GPU it prints SKIPPED and exits successfully.
//!
//! `cargo run --release -p clusterfuse-examples --bin tklqt-sweep -- [OUT_DIR]` (default `tklqt-sweep`)

use clusterfuse::f16;
use clusterfuse::host::trace::{self, AdviceOptions, Summary, Trace};
use clusterfuse::host::{Buffer, Gpu, LaunchConfig};
use clusterfuse_examples::check::{random, gpu_or_skip};
use clusterfuse_kernels::norms::{add_bias, add_residual, gelu_kernel, layer_norm, rms_norm, row_config};
use clusterfuse_examples::saxpy::saxpy;
use clusterfuse_kernels::softmax::softmax;
use std::error::Error;
use std::path::{Path, PathBuf};

const BATCHES: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
const LAYERS: usize = 12;
const HIDDEN: u32 = 4096;
/// Tokens per batch element.
const SEQ: u32 = 64;
/// Softmax rows per token (attention heads); each row has `SEQ` columns.
const HEADS: u32 = 32;
const PASSES: usize = 3;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// The kernels of a layer, loaded once.
struct Kernels {
    add_residual: add_residual::Kernel,
    rms_norm: rms_norm::Kernel,
    saxpy: saxpy::Kernel,
    softmax: softmax::Kernel,
    add_bias: add_bias::Kernel,
    layer_norm: layer_norm::Kernel,
    gelu: gelu_kernel::Kernel,
}

/// One batch size's buffers: activations of `tokens × HIDDEN`, per-column parameters, and
/// the softmax's `tokens × HEADS` rows of `SEQ`.
struct Batch {
    tokens: u32,
    x: Buffer<f16>,
    r: Buffer<f16>,
    res: Buffer<f16>,
    h: Buffer<f16>,
    y: Buffer<f16>,
    z: Buffer<f16>,
    out: Buffer<f16>,
    weight: Buffer<f16>,
    bias: Buffer<f16>,
    gamma: Buffer<f16>,
    beta: Buffer<f16>,
    xs: Buffer<f32>,
    ys: Buffer<f32>,
    scores: Buffer<f32>,
    probs: Buffer<f32>,
}

impl Batch {
    fn new(gpu: &Gpu, batch: u32) -> Result<Self> {
        let tokens = batch * SEQ;
        let (n, h, rows) = (tokens as usize * HIDDEN as usize, HIDDEN as usize, (tokens * HEADS * SEQ) as usize);
        let halves = |len: usize| gpu.upload(&random(len).into_iter().map(f16::from_f32).collect::<Vec<_>>());
        Ok(Self {
            tokens,
            x: halves(n)?,
            r: halves(n)?,
            res: halves(n)?,
            h: halves(n)?,
            y: halves(n)?,
            z: halves(n)?,
            out: halves(n)?,
            weight: halves(h)?,
            bias: halves(h)?,
            gamma: halves(h)?,
            beta: halves(h)?,
            xs: gpu.upload(&random(n))?,
            ys: gpu.upload(&random(n))?,
            scores: gpu.upload(&random(rows))?,
            probs: gpu.upload(&random(rows))?,
        })
    }

    /// Launches the 12 layers (84 kernels) on the default stream.
    fn forward(&mut self, gpu: &Gpu, k: &Kernels) -> clusterfuse::host::Result<()> {
        let s = gpu.stream();
        let rows = row_config(HIDDEN, self.tokens);
        let n = self.tokens * HIDDEN;
        let elementwise = LaunchConfig { grid: n.div_ceil(256).into(), block: 256.into(), ..LaunchConfig::default() };
        let softmax_rows = self.tokens * HEADS;
        let softmax = LaunchConfig { grid: softmax_rows.div_ceil(8).into(), block: 256.into(), ..LaunchConfig::default() };
        for _ in 0..LAYERS {
            k.add_residual.launch(s, &rows, &self.x, &self.r, &mut self.res)?;
            k.rms_norm.launch(s, &rows, &self.res, &self.weight, &mut self.h, HIDDEN)?;
            k.saxpy.launch(s, &elementwise, 0.5, &self.xs, &mut self.ys)?;
            k.softmax.launch(s, &softmax, &self.scores, &mut self.probs, SEQ)?;
            k.add_bias.launch(s, &rows, &self.h, &self.bias, &mut self.y)?;
            k.layer_norm.launch(s, &rows, &self.y, &self.gamma, &self.beta, &mut self.z, HIDDEN)?;
            k.gelu.launch(s, &rows, &self.z, &mut self.out)?;
        }
        Ok(())
    }
}

fn main() -> Result<()> {
    let Some(gpu) = gpu_or_skip("tklqt-sweep") else {
        return Ok(());
    };
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "tklqt-sweep".into()));
    std::fs::create_dir_all(&dir)?;
    let kernels = Kernels {
        add_residual: add_residual::load(&gpu)?,
        rms_norm: rms_norm::load(&gpu)?,
        saxpy: saxpy::load(&gpu)?,
        softmax: softmax::load(&gpu)?,
        add_bias: add_bias::load(&gpu)?,
        layer_norm: layer_norm::load(&gpu)?,
        gelu: gelu_kernel::load(&gpu)?,
    };
    println!(
        "{} — {LAYERS} layers × 7 kernels, hidden {HIDDEN}, {SEQ} tokens per batch element, {PASSES} recorded passes per batch",
        gpu.name()?
    );
    let mut traces = Vec::new();
    for (i, &batch) in BATCHES.iter().enumerate() {
        eprint!("[{}/{}] batch {batch}: ", i + 1, BATCHES.len());
        let mut b = Batch::new(&gpu, batch)?;
        let mut passes = || {
            (0..PASSES).try_for_each(|_| {
                b.forward(&gpu, &kernels)?;
                gpu.synchronize()
            })
        };
        // Warm-up, recorded too: it also creates the recorder's events for the run after it.
        gpu.record("warm-up", None, &mut passes)?;
        let ((), trace) = gpu.record(format!("{LAYERS} layers b={batch}"), Some(batch), passes)?;
        let path = dir.join(format!("tklqt-b{batch:02}.jsonl"));
        trace.save(&path)?;
        let s = Summary::of(&trace);
        eprintln!("{} launches, wall {:.0} µs, GPU idle {:.0}% → {}", s.kernels, s.wall_ns as f64 / 1e3, 100.0 * s.idle_fraction(), path.display());
        traces.push(trace);
    }
    report(&traces, &dir)
}

/// Prints the tables and advice, and writes the plots into `dir`.
fn report(traces: &[Trace], dir: &Path) -> Result<()> {
    let (text, plots) = trace::sweep_report(traces, &AdviceOptions::default());
    println!("\n{text}");
    for (name, plot) in plots {
        let path = dir.join(name);
        std::fs::write(&path, plot.to_svg())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
