//! A whole decode step of a Llama-3.2-1B-shaped model (16 layers, hidden 2048, 32 query / 8 KV
//! heads of 64, MLP 8192, vocabulary 128256, tied embedding; random bf16 weights, 2.47 GB) at
//! batch 1 and KV lengths 1024 and 4096, side by side in one run, through the kernel library's
//! entry points (`clusterfuse_kernels::llama`): the persistent step, one launch a step
//! (replayed from a CUDA graph of one node), its grid in clusters of 4, 8 and 16; and the
//! chain's six kernels, 82 launches a step with programmatic dependent launch ("PDL") from a
//! CUDA graph, the attention with clusters of 8 and 16 blocks per KV head. `--all` adds the
//! chain's other variants: in stream order, launched directly, clusters of
//! 4, and a projection block per item instead of at most two per SM; `--quick` runs only L =
//! 1024 and clusters of 16.
//!
//! Every variant is first checked against the f64 reference of the whole step (logits and
//! every layer's appended k, v; relative error within 1e-3; activations and logits poisoned)
//! and run a second time (from its graph, when it has one) for bitwise-equal outputs; only a
//! variant that passes is timed: CUDA events around a pass of 20 back-to-back steps (all at
//! the same position: each step starts again from the token's embedding), the median of 30
//! passes after 3 warm-up passes, µs per step and tokens/s. The weights exceed the 60 MB L2
//! 40-fold, so each step reads them from HBM. Roofline = bytes that must move (every weight
//! once, every layer's cached k, v of tokens 0..=pos, the embedding row, the logits) / the
//! card's copy bandwidth, measured first (`check::copy_bandwidth`).
//!
//! `cargo run --release -p clusterfuse-examples --bin llama-bench`

use clusterfuse::host::Gpu;
use clusterfuse_examples::check::{copy_bandwidth, gpu_or_skip, median_us_per_call, print_rows, with_rng, Report};
use rand::Rng;
use clusterfuse_kernels::llama::chain::host::{attention_config, projection_config, step, Buffers, Kernels};
use clusterfuse_kernels::llama::{Model, Shape, TOLERANCE};
use clusterfuse_kernels::llama::persistent::host::{self as persistent, config as persistent_config};
use clusterfuse_kernels::llama::persistent::llama_step;
use std::error::Error;
use std::time::Instant;

const LENGTHS: [usize; 2] = [1024, 4096];
const CLUSTERS: [u32; 3] = [4, 8, 16];
/// Example 13's variants without `--all`: clusters of 8 and 16, PDL, CUDA graph.
const CHAIN_CLUSTERS: [u32; 2] = [8, 16];
const STEPS_PER_PASS: usize = 20;
const WARMUP: usize = 3;
const REPS: usize = 30;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// Checks one variant at the model's position and times it: a table row.
fn measure((gpu, bandwidth): (&Gpu, f64), kernels: &Kernels, model: &Model, expected: &[f64], cluster: u32, programmatic: bool, graph: bool) -> Result<String> {
    let pos = model.position;
    let roofline_us = model.shape.step_bytes(pos) as f64 / bandwidth * 1e6;
    let label = format!(
        "cluster {cluster}, {}, {}{}",
        if programmatic { "PDL" } else { "stream order" },
        if graph { "CUDA graph" } else { "launched" },
        if kernels.resident == u32::MAX { ", a block per item" } else { "" }
    );
    let mut b = Buffers::upload(gpu, model)?;
    step(kernels, gpu.stream(), &mut b, cluster, programmatic)?;
    let first = b.results(gpu, pos)?;
    b.poison(gpu)?;
    // Captured after `poison`, which reallocates the activations: `b` is not changed again.
    let graph = if graph { Some(gpu.capture(|s| step(kernels, s, &mut b, cluster, programmatic))?) } else { None };
    let run = |b: &mut Buffers| match &graph {
        // SAFETY: the graph holds `b`'s buffers, alive and unchanged until `b` drops, after the graph.
        Some(graph) => unsafe { graph.replay(gpu.stream()) },
        None => step(kernels, gpu.stream(), b, cluster, programmatic),
    };
    run(&mut b)?;
    let second = b.results(gpu, pos)?;
    row(gpu, &label, pos, roofline_us, &first, &second, expected, |_| run(&mut b))
}

/// Checks the persistent step at the model's position and times it from a graph: a row.
/// Also returns where one step's time went (`persistent::phases`), as a table.
fn measure_persistent((gpu, bandwidth): (&Gpu, f64), kernel: &llama_step::Kernel, model: &Model, expected: &[f64], cluster: u32) -> Result<(String, String)> {
    let pos = model.position;
    let roofline_us = model.shape.step_bytes(pos) as f64 / bandwidth * 1e6;
    let config = persistent_config(kernel, gpu, model.shape, cluster)?;
    let label = format!("persistent, one launch: {} blocks in clusters of {cluster}, CUDA graph", config.grid.x);
    let mut b = persistent::Buffers::upload(gpu, model)?;
    persistent::step(kernel, gpu.stream(), &config, &mut b)?;
    let first = b.results(gpu, pos)?;
    b.poison(gpu)?;
    let graph = gpu.capture(|s| persistent::step(kernel, s, &config, &mut b))?;
    // SAFETY: the graph holds `b`'s buffers, alive and unchanged until `b` drops, after the graph.
    let run = || unsafe { graph.replay(gpu.stream()) };
    run()?;
    let second = b.results(gpu, pos)?;
    let row = row(gpu, &label, pos, roofline_us, &first, &second, expected, |_| run())?;
    // One more step, launched (the graph holds the buffers of before), stamping its stages.
    b.record_timeline(gpu, config.grid.x)?;
    persistent::step(kernel, gpu.stream(), &config, &mut b)?;
    let timeline = b.timeline(gpu)?;
    let phases = persistent::phases(&timeline, config.grid.x as usize);
    let mut report = format!("\nL {}, clusters of {cluster}: one step's stages (from %globaltimer stamps; µs)\n| stage | share of the step | mean wait per block | mean input to end per block |\n|---|---|---|---|\n", pos + 1);
    for (name, share, wait, work) in phases {
        report += &format!("| {name} | {share:.1} | {wait:.2} | {work:.2} |\n");
    }
    let layer = model.shape.layers / 2;
    report += &format!("\nlayer {layer}, µs from its first block's start: | stage | first start | last input ready | last end |\n|---|---|---|---|\n");
    for (name, [start, ready, end]) in ["QKV", "attention", "W_o", "gate/up", "down"].iter().zip(persistent::layer_stages(&timeline, config.grid.x as usize, layer)) {
        report += &format!("| {name} | {start:.1} | {ready:.1} | {end:.1} |\n");
    }
    Ok((row, report))
}

/// The table row of a variant whose two runs gave `first` and `second`: timed by `run` if
/// both match the reference and each other, FAIL otherwise.
#[allow(clippy::too_many_arguments)]
fn row(gpu: &Gpu, label: &str, pos: usize, roofline_us: f64, first: &[f32], second: &[f32], expected: &[f64], run: impl FnMut(usize) -> clusterfuse::host::Result<()>) -> Result<String> {
    let report = Report::new(format!("L {}", pos + 1), first, expected, TOLERANCE);
    let deterministic = first.iter().zip(second).all(|(a, b)| a.to_bits() == b.to_bits());
    if !report.passed() || !deterministic {
        eprintln!("FAIL {label} at L {}: rel error {:.2e}, unwritten {}, deterministic: {deterministic}", pos + 1, report.rel_error, report.unwritten);
        return Ok(format!("| {} | {label} | FAIL | – | {roofline_us:.1} | – | {:.2e} |", pos + 1, report.rel_error));
    }
    let us = median_us_per_call(gpu, (WARMUP, REPS), STEPS_PER_PASS, run)?;
    Ok(format!("| {} | {label} | {us:.1} | {:.0} | {roofline_us:.1} | {:.0}% | {:.2e} |", pos + 1, 1e6 / us, roofline_us / us * 100.0, report.rel_error))
}

fn main() -> Result<()> {
    let Some(gpu) = gpu_or_skip("llama-bench") else {
        return Ok(());
    };
    let all = std::env::args().any(|a| a == "--all");
    let quick = std::env::args().any(|a| a == "--quick");
    let (lengths, clusters) = if quick { (&LENGTHS[..1], &CLUSTERS[2..]) } else { (&LENGTHS[..], &CLUSTERS[..]) };
    let mut kernels = Kernels::load(&gpu)?;
    let persistent_kernel = llama_step::load(&gpu)?;
    let shape = Shape::llama_3_2_1b(LENGTHS[LENGTHS.len() - 1]);
    let (h, i) = (shape.hidden, shape.inter);
    for (name, c) in [
        ("qkv", projection_config((shape.heads + 2 * shape.kv_heads) * 32, h, kernels.resident, true)),
        ("o_proj", projection_config(h / 2, h, kernels.resident, true)),
        ("gate_up", projection_config(i, h, kernels.resident, true)),
        ("down", projection_config(h / 2, i, kernels.resident, true)),
        ("lm_head", projection_config(shape.vocab / 2, h, kernels.resident, true)),
        ("attention", attention_config(shape, CLUSTERS[0], true)),
    ] {
        eprintln!("{name}: {} blocks of {}, cluster {:?}, {} B dynamic shared memory", c.grid.x, c.block.x, c.cluster.map(|c| c.x), c.dynamic_smem_bytes);
    }
    let started = Instant::now();
    let mut model = Model::random(shape, with_rng(|rng| rng.random()), LENGTHS[0] - 1, 128_000)?;
    eprintln!("{} parameters generated in {:.1} s", shape.parameters(), started.elapsed().as_secs_f64());
    let bandwidth = copy_bandwidth(&gpu)?;
    let card = (&gpu, bandwidth);
    let (mut rows, mut phase_tables) = (Vec::new(), Vec::new());
    for &len in lengths {
        model.set_position(len - 1);
        let started = Instant::now();
        let expected = model.reference().all();
        eprintln!("L = {len}: f64 reference in {:.1} s; runs ...", started.elapsed().as_secs_f64());
        for &cluster in clusters {
            let (row, phases) = measure_persistent(card, &persistent_kernel, &model, &expected, cluster).unwrap_or_else(|err| {
                eprintln!("FAIL persistent, clusters of {cluster}, at L {len}: {err}");
                (format!("| {len} | persistent, clusters of {cluster} | FAIL: {err} | – | – | – | – |"), String::new())
            });
            rows.push(row);
            phase_tables.push(phases);
        }
        for &cluster in clusters.iter().filter(|c| all || CHAIN_CLUSTERS.contains(c)) {
            // The last variant again with a projection block per item (the grids before the item loop).
            let resident = kernels.resident;
            let variants = [(false, false, false), (true, false, false), (false, true, false), (true, true, false), (true, true, true)];
            for (programmatic, graph, per_item) in variants.into_iter().filter(|&v| all || v == (true, true, false)) {
                kernels.resident = if per_item { u32::MAX } else { resident };
                // A variant the driver refuses (say, PDL on a cluster launch) is a FAIL row; the others still run.
                let row = measure(card, &kernels, &model, &expected, cluster, programmatic, graph).unwrap_or_else(|err| {
                    eprintln!("FAIL cluster {cluster}, PDL {programmatic}, graph {graph} at L {len}: {err}");
                    format!("| {len} | cluster {cluster}, PDL {programmatic}, CUDA graph {graph} | FAIL: {err} | – | – | – | – |")
                });
                rows.push(row);
            }
            kernels.resident = resident;
        }
    }
    println!(
        "{} — Llama-3.2-1B decode step (16 layers, hidden 2048, 32/8 heads × 64, MLP 8192, vocab 128256, bf16 weights and KV cache, batch 1): one persistent launch a step, or 82 launches; median of {REPS} passes of {STEPS_PER_PASS} steps (CUDA events), µs per step; roofline = bytes / {:.2} TB/s (measured copy bandwidth)",
        gpu.name()?,
        bandwidth / 1e12
    );
    println!("| L | variant | µs/step | tokens/s | roofline µs | % of roofline | rel error vs f64 |");
    println!("|---|---|---|---|---|---|---|");
    let outcome = print_rows(&rows);
    phase_tables.iter().for_each(|t| print!("{t}"));
    Ok(outcome?)
}
