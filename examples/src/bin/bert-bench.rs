//! Issue 7's case study: example 11's BERT-base encoder (12 layers, hidden 768, 12 heads,
//! ffn 3072, sequence 128, fp16, random weights) at batch 1-64, unfused (16 kernels a layer, as
//! a framework launches them), fused (7; 5 at batch 1-4) and both replayed from a CUDA graph.
//!
//! First the checks, failing loudly: one layer at batch 1, 2, 8 and 16 in both modes against the
//! f64 reference, and the 12-layer outputs of both modes at batch 1 against each other. Then per
//! batch and mode: one forward pass (ended by a synchronisation) recorded to warm up and one
//! for the trace (`bert-<mode>-bNN.jsonl`, with its launch count checked), the latency of a
//! pass (median of 20 after 3 warm-up, CUDA events around each, from an idle GPU: the launch
//! counts, as in a request's latency), and the same for the pass captured into a
//! graph. Prints the latency table, then per mode the TKLQT summary and CPU-/GPU-bound sweep
//! tables and the fusion advice at batch 1, and writes `<mode>-tklqt.svg` and
//! `<mode>-latency.svg`. Progress goes to stderr. Without a GPU it prints SKIPPED and exits
//! successfully. `scripts/bert-torch.py` times PyTorch on the same model.
//!
//! `cargo run --release -p clusterfuse-examples --bin bert-bench -- [OUT_DIR [BATCH ...]]`
//! (default `bert-bench`, batches 1-64; the sweep tables need more than one batch).

use clusterfuse::f16;
use clusterfuse::host::trace::{self, AdviceOptions, Summary, Trace};
use clusterfuse::host::Gpu;
use clusterfuse_examples::bert;
use clusterfuse_kernels::bert::{Batch, Dims, Kernels, Mode, Model, BERT_BASE};
use clusterfuse_examples::check::{gpu_or_skip, median_latency_us, random, with_rng, Report};
use rand::Rng;
use clusterfuse_kernels::wgmma_gemm::{SmLayout, MAX_SPLITS};
use std::error::Error;
use std::path::{Path, PathBuf};

const BATCHES: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// The batches whose one layer is checked against the f64 reference: one and two row tiles
/// of the fused mode's split-K projections with its LayerNorms deferred, and batch 8 and 16,
/// where O and FFN2 alone take them (FFN2 split over two blocks at 16).
const CHECK_BATCHES: [usize; 4] = [1, 2, 8, 16];
const WARMUP: usize = 3;
const REPS: usize = 20;
/// Relative difference allowed between the modes' 12-layer outputs: each is within
/// [`TOLERANCE`](clusterfuse_kernels::bert::TOLERANCE) of its reference over two layers, and their GELUs differ (erf, tanh).
const MODES_AGREE: f64 = 2e-2;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn main() -> Result<()> {
    let Some(gpu) = gpu_or_skip("bert-bench") else {
        return Ok(());
    };
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(args.next().unwrap_or_else(|| "bert-bench".into()));
    let mut batches = args.map(|b| b.parse::<usize>()).collect::<std::result::Result<Vec<_>, _>>()?;
    if batches.is_empty() {
        batches = BATCHES.to_vec();
    }
    std::fs::create_dir_all(&dir)?;
    let d = BERT_BASE;
    println!(
        "{} — BERT-base encoder: {} layers, hidden {}, {} heads, ffn {}, seq {}, fp16; µs per forward pass, median of {REPS} (CUDA events)",
        gpu.name()?,
        d.layers,
        d.hidden,
        d.heads,
        d.ffn,
        d.seq
    );
    if let Some(layout) = SmLayout::of(&gpu)? {
        println!("split-K clusters of 1-{MAX_SPLITS} blocks resident at once: {:?}", (1..=MAX_SPLITS).map(|s| layout.clusters(s)).collect::<Vec<_>>());
    }
    for batch in CHECK_BATCHES {
        eprintln!("checking one layer at batch {batch} against the f64 reference ...");
        let one_layer = bert::check(&gpu, Dims { layers: 1, ..d }, batch)?;
        println!("check: {} — rel error {:.2e} (tolerance {:.0e}), {} unwritten", one_layer.shape, one_layer.rel_error, one_layer.tolerance, one_layer.unwritten);
        if !one_layer.passed() {
            return Err("the encoder layer does not match its f64 reference".into());
        }
    }
    let kernels = Kernels::load(&gpu)?;
    let model = Model::random(&gpu, d, with_rng(|rng| rng.random()))?;
    let agree = modes_agree(&gpu, &kernels, &model)?;
    println!("check: 12 layers, batch 1, unfused vs fused — rel difference {:.2e} (tolerance {MODES_AGREE:.0e}), {} unwritten", agree.rel_error, agree.unwritten);
    if !agree.passed() {
        return Err("the unfused and fused encoders disagree".into());
    }

    println!("\n| batch | tokens | mode | kernels | µs |");
    println!("|---|---|---|---|---|");
    let mut traces: Vec<Vec<Trace>> = vec![Vec::new(); Mode::ALL.len()];
    for (i, &batch) in batches.iter().enumerate() {
        let x: Vec<f16> = random(batch * d.seq * d.hidden).into_iter().map(f16::from_f32).collect();
        for (m, mode) in Mode::ALL.into_iter().enumerate() {
            eprint!("[{}/{}] batch {batch}, {}: ", i + 1, batches.len(), mode.name());
            let mut b = Batch::new(&gpu, &d, batch, &x)?;
            let kernel_count = b.kernels(mode, d.layers);
            let mut pass = || -> clusterfuse::host::Result<()> {
                b.forward(gpu.stream(), &kernels, &model, mode)?;
                gpu.synchronize()
            };
            gpu.record("warm-up", None, &mut pass)?;
            let ((), trace) = gpu.record(format!("BERT-base {} b={batch}", mode.name()), Some(batch as u32), &mut pass)?;
            let s = Summary::of(&trace);
            if s.kernels != kernel_count {
                return Err(format!("{} at batch {batch}: {} launches recorded, {kernel_count} expected", mode.name(), s.kernels).into());
            }
            let path = dir.join(format!("bert-{}-b{batch:02}.jsonl", mode.name()));
            trace.save(&path)?;
            traces[m].push(trace);

            let eager = latency_us(&gpu, || b.forward(gpu.stream(), &kernels, &model, mode))?;
            let graph = gpu.capture(|s| b.forward(s, &kernels, &model, mode))?;
            // SAFETY: `b`'s buffers and the model's weights outlive the graph, unresized.
            let replayed = latency_us(&gpu, || unsafe { graph.replay(gpu.stream()) })?;
            eprintln!("eager {eager:.0} µs, graph {replayed:.0} µs, TKLQT {:.0} µs → {}", s.tklqt_ns as f64 / 1e3, path.display());
            println!("| {batch} | {} | {} | {kernel_count} | {eager:.1} |", b.tokens, mode.name());
            println!("| {batch} | {} | {} graph | {} | {replayed:.1} |", b.tokens, mode.name(), graph.nodes());
        }
    }
    for (mode, traces) in Mode::ALL.into_iter().zip(&traces) {
        report(mode, traces, &dir)?;
    }
    Ok(())
}

/// The 12-layer outputs of both modes at batch 1 on the same input, the unfused one
/// compared with the fused one.
fn modes_agree(gpu: &Gpu, kernels: &Kernels, model: &Model) -> Result<Report> {
    let d = model.dims;
    let x: Vec<f16> = random(d.seq * d.hidden).into_iter().map(f16::from_f32).collect();
    let mut outputs = Vec::new();
    for mode in Mode::ALL {
        let mut b = Batch::new(gpu, &d, 1, &x)?;
        b.forward(gpu.stream(), kernels, model, mode)?;
        outputs.push(gpu.download(b.x())?.into_iter().map(|v| v.to_f32()).collect::<Vec<f32>>());
    }
    let fused: Vec<f64> = outputs[1].iter().map(|&v| v as f64).collect();
    Ok(Report::new("12 layers, batch 1".into(), &outputs[0], &fused, MODES_AGREE))
}

/// Median over [`REPS`] passes of `enqueue`'s latency from an idle GPU, after [`WARMUP`]
/// passes, in µs: a request's, its launch included.
fn latency_us(gpu: &Gpu, enqueue: impl FnMut() -> clusterfuse::host::Result<()>) -> Result<f64> {
    Ok(median_latency_us(gpu, (WARMUP, REPS), enqueue)?)
}

/// Prints one mode's tables and advice, and writes its plots into `dir`.
fn report(mode: Mode, traces: &[Trace], dir: &Path) -> Result<()> {
    println!("\n## {}", mode.name());
    let (text, plots) = trace::sweep_report(traces, &AdviceOptions::default());
    println!("\n{text}");
    for (name, plot) in plots {
        let path = dir.join(format!("{}-{name}", mode.name()));
        std::fs::write(&path, plot.to_svg())?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
