//! The decode-step attention block of Llama-2-7B (hidden 4096, 32 heads of 128) at KV lengths
//! 1024, 4096 and 16384: example 09's fused kernels (two launches: a cluster per head up to
//! the attention, then the output projection over the whole GPU) with clusters of 4 (also
//! replayed from a CUDA graph of one step, and with the output projection a programmatic
//! dependent launch, "PDL", launched and from a graph) and 8, the spread variant (three
//! launches: the QKV projection with RMSNorm and RoPE over the whole GPU, the attention a
//! cluster of 4 per head, the output projection; the same four launch modes, and clusters of
//! 8 launched with and without PDL; f16 and bf16, batch 1), the same stages as five separate
//! kernels (f16, batch 1), the persistent block (one launch: the fused variant's two stages,
//! the output projection waiting on the heads' published outputs; clusters of 4 and 8, f16,
//! and 4, bf16; launched and from a graph), the fused kernels on bf16, and at batch 8 (eight
//! sequences, each with its own cache, all at the same length).
//!
//! Every variant is first checked at every length against the f64 reference of the whole
//! block (fresh random weights and caches each run; `out` poisoned; relative error over
//! `out` and the appended k, v within 2e-3 for f16, 5e-3 for bf16) and run twice for
//! bitwise-equal outputs; only a variant that passes is timed. Timing: CUDA events around a
//! pass of 20 back-to-back steps, the median of 50 passes after 5 warm-up passes, µs per
//! step. Weights (134 MB) plus caches exceed the 60 MB L2 at every length, so one set of
//! buffers is used: each step reads them from HBM. Roofline = bytes that must move (weights,
//! every sequence's cache tokens 0..pos, the new k/v, x and out) / the card's copy bandwidth,
//! measured first (`check::copy_bandwidth`).
//!
//! `--dump DIR` also writes the L = 1024 inputs and the fused f16 batch-1 results as raw
//! little-endian files for `scripts/decode-torch.py --check DIR`, and the same inputs with the
//! spread variant's results in `DIR/spread`.
//!
//! `cargo run --release -p clusterfuse-examples --bin decode-bench [-- --dump DIR]`

use clusterfuse::host::{Gpu, Stream};
use clusterfuse::{bf16, f16};
use clusterfuse_examples::check::{copy_bandwidth, gpu_or_skip, median_us_per_call, print_rows, with_rng, Report};
use rand::Rng;
use clusterfuse_kernels::decode::host::{attend_config, attention_config, fused, o_proj_config, persistent_config, persistent_phases, qkv_rope_config, spread, Buffers, DecodeType, Separate, Step};
use clusterfuse_kernels::decode::{EPS, HEAD_DIM, THETA};
use std::error::Error;
use std::path::{Path, PathBuf};

const HIDDEN: usize = 4096;
const LENGTHS: [usize; 3] = [1024, 4096, 16384];
const CLUSTERS: [u32; 2] = [4, 8];
const SEPARATE_CLUSTER: u32 = 8;
const BATCH: usize = 8;
const STEPS_PER_PASS: usize = 20;
const WARMUP: usize = 5;
const REPS: usize = 50;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Bytes one step must move (each sequence's tokens `0 ..= pos` attended).
fn bytes<T>(step: &Step<T>) -> f64 {
    let h = step.hidden;
    let weights = (4 * h * h + h) * 2;
    let cache: usize = step.positions.iter().map(|p| 2 * step.heads() * (p + 1) * HEAD_DIM * 2).sum();
    (weights + cache + 2 * step.batch() * h * 2) as f64
}

/// One table row: a variant of one type at one length.
struct Row<'a, T: DecodeType> {
    gpu: &'a Gpu,
    /// The card's copy bandwidth, bytes per second: the roofline's rate.
    bandwidth: f64,
    step: &'a Step<T>,
    expected: &'a [f64],
    label: String,
    kernels: u32,
    /// Replay the step's launches from a CUDA graph instead of launching them.
    graph: bool,
}

impl<T: DecodeType> Row<'_, T> {
    /// Checks `launch` (twice, bitwise: launched, then as timed), times it, and returns the
    /// table row with the first run's results, or a FAIL row.
    fn measure(&self, mut launch: impl FnMut(&Stream, &mut Buffers<T>) -> clusterfuse::host::Result<()>) -> Result<(String, Option<Vec<f32>>)> {
        let (gpu, step, len) = (self.gpu, self.step, self.step.positions[0] + 1);
        let roofline_us = bytes(step) / self.bandwidth * 1e6;
        // Fresh buffers: a step rewrites the cache at `pos`, which a longer L reads.
        let mut b = Buffers::upload(gpu, step)?;
        launch(gpu.stream(), &mut b)?;
        let first = b.results(gpu, step)?;
        b.poison(gpu)?;
        // Captured after `poison`, which reallocates `out` and `attn`: `b` is not changed again.
        let graph = if self.graph { Some(gpu.capture(|s| launch(s, &mut b))?) } else { None };
        let mut run = |b: &mut Buffers<T>| match &graph {
            // SAFETY: the graph holds `b`'s buffers, alive and unchanged until `b` drops,
            // after the graph.
            Some(graph) => unsafe { graph.replay(gpu.stream()) },
            None => launch(gpu.stream(), b),
        };
        run(&mut b)?;
        let second = b.results(gpu, step)?;
        let report = Report::new(format!("L {len}"), &first, self.expected, T::TOLERANCE);
        let deterministic = first.iter().zip(&second).all(|(a, b)| a.to_bits() == b.to_bits());
        if !report.passed() || !deterministic {
            eprintln!("FAIL {} at L {len}: {report:?} deterministic: {deterministic}", self.label);
            let row = format!("| {len} | {} | {} | FAIL | {roofline_us:.1} | – | {:.2e} |", self.label, self.kernels, report.rel_error);
            return Ok((row, None));
        }
        let us = median_us_per_call(gpu, (WARMUP, REPS), STEPS_PER_PASS, |_| run(&mut b))?;
        let row = format!("| {len} | {} | {} | {us:.1} | {roofline_us:.1} | {:.0}% | {:.2e} |", self.label, self.kernels, roofline_us / us * 100.0, report.rel_error);
        Ok((row, Some(first)))
    }
}

fn write_f16(dir: &Path, name: &str, values: &[f16]) -> Result<()> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    std::fs::write(dir.join(name), raw)?;
    Ok(())
}

/// A batch-1 f16 step's inputs (cache tokens `0 .. pos` only) and a variant's `out` and
/// appended k, v.
fn dump(dir: &Path, step: &Step<f16>, results: &[f32]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let pos = step.positions[0];
    let meta = format!(
        "{{\"dtype\": \"f16\", \"batch\": 1, \"hidden\": {}, \"heads\": {}, \"head_dim\": {HEAD_DIM}, \"pos\": {pos}, \"eps\": {EPS}, \"theta\": {THETA}}}\n",
        step.hidden,
        step.heads(),
    );
    std::fs::write(dir.join("meta.json"), meta)?;
    for (name, values) in [("x", &step.x), ("norm_w", &step.norm_w), ("w_qkv", &step.w_qkv), ("w_o", &step.w_o)] {
        write_f16(dir, &format!("{name}.f16"), values)?;
    }
    for (name, cache) in [("k_cache", &step.k_cache), ("v_cache", &step.v_cache)] {
        let valid: Vec<f16> = (0..step.heads()).flat_map(|h| cache[h * step.max_len * HEAD_DIM..][..pos * HEAD_DIM].iter().copied()).collect();
        write_f16(dir, &format!("{name}.f16"), &valid)?;
    }
    let halves: Vec<f16> = results.iter().map(|&v| f16::from_f32(v)).collect();
    let (out, appended) = halves.split_at(step.hidden);
    write_f16(dir, "out.f16", out)?;
    write_f16(dir, "k_new.f16", &appended[..step.hidden])?;
    write_f16(dir, "v_new.f16", &appended[step.hidden..])?;
    Ok(())
}

/// How a variant runs a step: [`fused`] or [`spread`].
type Launch<T> = fn(&<T as DecodeType>::Kernels, &Stream, &mut Buffers<T>, u32, bool) -> clusterfuse::host::Result<()>;

/// The fused variant (2 kernels).
fn fused_variant<T: DecodeType>() -> (&'static str, u32, Launch<T>) {
    ("fused", 2, fused::<T>)
}

/// The spread variant (3 kernels, batch 1).
fn spread_variant<T: DecodeType>() -> (&'static str, u32, Launch<T>) {
    ("spread", 3, spread::<T>)
}

/// Rows of a variant of `T` (its name, kernels and launch) at `step`'s length, one per cluster
/// size in `clusters`, launched and (with `graph`) also replayed from a CUDA graph of one
/// step, in stream order and (with `pdl`) with the kernels after the first launched
/// programmatically. Returns the first row's results.
#[allow(clippy::too_many_arguments)]
fn variant_rows<T: DecodeType>(
    (gpu, bandwidth): (&Gpu, f64),
    kernels: &T::Kernels,
    (variant, launches, launch): (&str, u32, Launch<T>),
    step: &Step<T>,
    expected: &[f64],
    clusters: &[u32],
    graph: bool,
    pdl: bool,
    rows: &mut Vec<String>,
) -> Result<Option<Vec<f32>>> {
    let mut first_results = None;
    for &cluster in clusters {
        for programmatic in [false, true].into_iter().filter(|&p| pdl || !p) {
            for graph in [false, true].into_iter().filter(|&g| graph || !g) {
                let how = match (programmatic, graph) {
                    (false, false) => "",
                    (false, true) => ", CUDA graph",
                    (true, false) => ", PDL",
                    (true, true) => ", PDL, CUDA graph",
                };
                let label = format!("clusterfuse {variant} (cluster {cluster}{how}), {}, batch {}", T::NAME, step.batch());
                let row = Row { gpu, bandwidth, step, expected, label, kernels: launches, graph };
                let (line, results) = row.measure(|s, b| launch(kernels, s, b, cluster, programmatic))?;
                rows.push(line);
                first_results = first_results.or(results);
            }
        }
    }
    Ok(first_results)
}

/// Rows of the persistent block of `T` (one launch, batch 1) at `step`'s length, one per
/// cluster size in `clusters`, launched and replayed from a CUDA graph of one step.
fn persistent_rows<T: DecodeType>((gpu, bandwidth): (&Gpu, f64), kernels: &T::Kernels, step: &Step<T>, expected: &[f64], clusters: &[u32], rows: &mut Vec<String>) -> Result<()> {
    for &cluster in clusters {
        let config = persistent_config::<T>(kernels, gpu, step.hidden, cluster)?;
        for graph in [false, true] {
            let how = if graph { ", CUDA graph" } else { "" };
            let label = format!("clusterfuse persistent ({} blocks in clusters of {cluster}{how}), {}, batch 1", config.grid.x, T::NAME);
            let row = Row { gpu, bandwidth, step, expected, label, kernels: 1, graph };
            rows.push(row.measure(|s, b| T::persistent(kernels, s, b, &config))?.0);
        }
        // One more launch with the timeline on: where the time goes.
        let mut b = Buffers::upload(gpu, step)?;
        b.record_timeline(gpu, config.grid.x)?;
        T::persistent(kernels, gpu.stream(), &mut b, &config)?;
        let [heads, ready, end, work] = persistent_phases(&gpu.download(&b.timeline)?);
        eprintln!(
            "persistent, {}, L {}, clusters of {cluster}: last head done {heads:.1} µs, all heads' outputs seen {ready:.1}, last end {end:.1} (µs from the first block's start); output projection {work:.1} µs a block from input to end",
            T::NAME,
            step.positions[0] + 1
        );
    }
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dump_dir: Option<PathBuf> = args.iter().position(|a| a == "--dump").map(|i| args.get(i + 1).expect("--dump needs a directory").into());
    let Some(gpu) = gpu_or_skip("decode-bench") else {
        return Ok(());
    };
    let (f16_kernels, bf16_kernels) = (<f16 as DecodeType>::load(&gpu)?, <bf16 as DecodeType>::load(&gpu)?);
    let mut separate = Separate::load(&gpu, HIDDEN)?;
    let heads = HIDDEN / HEAD_DIM;
    for batch in [1, BATCH] {
        for cluster in CLUSTERS {
            let resident = f16::max_active_clusters(&f16_kernels, &gpu, HIDDEN, batch, cluster)?;
            let smem = attention_config(HIDDEN, batch, cluster).dynamic_smem_bytes;
            eprintln!("fused 1/2, batch {batch}, clusters of {cluster}: {resident} resident at once (the grid has {heads}; {smem} B dynamic shared memory a block)");
        }
        let o = o_proj_config(HIDDEN, batch);
        eprintln!("fused 2/2, batch {batch}: {} blocks of {}, {} B dynamic shared memory a block", o.grid.x, o.block.x, o.dynamic_smem_bytes);
    }
    let (q, a) = (qkv_rope_config(HIDDEN), attend_config(HIDDEN, CLUSTERS[0], true));
    eprintln!("spread 1/3: {} blocks of {}, {} B dynamic shared memory a block; spread 2/3: {} blocks in clusters of {}", q.grid.x, q.block.x, q.dynamic_smem_bytes, a.grid.x, CLUSTERS[0]);
    let bandwidth = copy_bandwidth(&gpu)?;
    let card = (&gpu, bandwidth);
    let max_len = LENGTHS[LENGTHS.len() - 1];
    eprintln!("generating weights and {max_len}-token caches (f16 batch 1 and {BATCH}, bf16 batch 1) ...");
    let seed = || -> u64 { with_rng(|rng| rng.random()) };
    let mut f16_step = Step::<f16>::random(seed(), HIDDEN, max_len, &[max_len - 1]);
    let mut bf16_step = Step::<bf16>::random(seed(), HIDDEN, max_len, &[max_len - 1]);
    let mut batch_step = Step::<f16>::random(seed(), HIDDEN, max_len, &[max_len - 1; BATCH]);
    let mut rows = Vec::new();
    for len in LENGTHS {
        eprintln!("L = {len}: f64 references and runs ...");
        f16_step.set_positions(&[len - 1]);
        let expected = f16_step.reference().all();
        let first = variant_rows(card, &f16_kernels, fused_variant(), &f16_step, &expected, &CLUSTERS[..1], true, true, &mut rows)?;
        variant_rows(card, &f16_kernels, fused_variant(), &f16_step, &expected, &CLUSTERS[1..], false, false, &mut rows)?;
        persistent_rows(card, &f16_kernels, &f16_step, &expected, &CLUSTERS, &mut rows)?;
        let spread_first = variant_rows(card, &f16_kernels, spread_variant(), &f16_step, &expected, &CLUSTERS[..1], true, true, &mut rows)?;
        variant_rows(card, &f16_kernels, spread_variant(), &f16_step, &expected, &CLUSTERS[1..], false, true, &mut rows)?;
        if let (Some(dir), 1024) = (&dump_dir, len) {
            for (dir, results) in [(dir.clone(), first), (dir.join("spread"), spread_first)] {
                if let Some(results) = results {
                    dump(&dir, &f16_step, &results)?;
                }
            }
        }
        let label = format!("clusterfuse separate (cluster {SEPARATE_CLUSTER}), f16, batch 1");
        let row = Row { gpu: &gpu, bandwidth, step: &f16_step, expected: &expected, label, kernels: 5, graph: false };
        rows.push(row.measure(|s, b| separate.launch(s, b, SEPARATE_CLUSTER))?.0);

        bf16_step.set_positions(&[len - 1]);
        let expected = bf16_step.reference().all();
        variant_rows(card, &bf16_kernels, fused_variant(), &bf16_step, &expected, &CLUSTERS[..1], false, false, &mut rows)?;
        persistent_rows(card, &bf16_kernels, &bf16_step, &expected, &CLUSTERS[..1], &mut rows)?;
        variant_rows(card, &bf16_kernels, spread_variant(), &bf16_step, &expected, &CLUSTERS[..1], true, true, &mut rows)?;

        batch_step.set_positions(&[len - 1; BATCH]);
        let expected = batch_step.reference().all();
        variant_rows(card, &f16_kernels, fused_variant(), &batch_step, &expected, &CLUSTERS[..1], false, true, &mut rows)?;
    }
    println!(
        "{} — Llama-2-7B decode attention block (hidden {HIDDEN}, {heads} heads × {HEAD_DIM}); median of {REPS} passes of {STEPS_PER_PASS} steps (CUDA events), µs per step; roofline = bytes / {:.2} TB/s (measured copy bandwidth)",
        gpu.name()?,
        bandwidth / 1e12
    );
    println!("| L | variant | kernels | µs | roofline µs | % of roofline | rel error vs f64 |");
    println!("|---|---|---|---|---|---|---|");
    Ok(print_rows(&rows)?)
}
