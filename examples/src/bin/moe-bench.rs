//! The mixture-of-experts layer of the kernel library (`clusterfuse_kernels::moe`, two
//! launches: routing + gate/up in clusters of 2 or 4 (`plan`'s choice), then down + combine launched
//! programmatically; one on the fused schedule) on a Mixtral-8x7B-shaped layer (hidden 4096, 8 experts, top 2, FFN
//! 14336) and a DeepSeek-V2-Lite-shaped one (hidden 2048, 64 experts, top 8, FFN 1408), bf16,
//! at 64, 8 and 1 tokens (the first rows of one random batch), launched and replayed from a
//! CUDA graph, on each schedule (the one `plan` takes first, marked "planned"; the dense one
//! where the step has at least a pair an expert, the fused one up to its 8 tokens, where its
//! shared memory fits). A second
//! table gives each launch alone, a third where one step's time goes (`%globaltimer` stamps of
//! every block: [`Timeline`]).
//!
//! Every row is first checked against the f64 reference (fresh random weights each run;
//! outputs poisoned): the routing exactly (the reference's order, ties to the lower index),
//! `y` and the gate weights by relative error (≤ 1e-2), and run twice for bitwise-equal
//! outputs; only a row that passes is timed. Timing: CUDA events around a pass of 20
//! back-to-back steps, the median of 50 passes after 5 warm-up passes, µs per step. Roofline
//! = bytes a step must move (the router, the selected experts' weights read once, `x`, `y`)
//! over the device-to-device copy bandwidth measured here first (`check::copy_bandwidth`:
//! `cuMemcpyDtoD` of 1 GiB, bytes read + written per second, median of 20).
//!
//! `--dump DIR` writes each layer's weights and 64-token input, and every schedule's routing
//! and output at 64 tokens, as raw little-endian files for `scripts/moe-torch.py --check DIR`.
//! `--only NAME [TOKENS]` runs one layer, at the table's token counts or at `TOKENS` (any up
//! to 64; e.g. `--only DeepSeek 1`, for a profiler). `--ffn N` gives the experts' FFN width
//! `N` instead: at 128 (one 128-row unit an expert) a gate/up launch is mostly its routing.
//! `--cluster N`: gate/up clusters of `N` blocks (2-16) instead of `gate_up_cluster`'s choice.
//!
//! `cargo run --release -p clusterfuse-examples --bin moe-bench [-- --dump DIR | --only NAME [TOKENS] | --ffn N | --cluster N]`

use clusterfuse::bf16;
use clusterfuse::host::{Gpu, LaunchConfig};
use clusterfuse_examples::check::{copy_bandwidth, gpu_or_skip, median_us_per_call, print_rows, with_rng, Report};
use clusterfuse_kernels::moe::host::{down, gate_up, gate_up_cluster, multiprocessors, plan_schedule, schedule, step, Buffers, Kernels, Layer, Moe, Plan, Reference, Schedule, Timeline, TOLERANCE};
use clusterfuse_kernels::moe::FUSED_MAX_TOKENS;
use rand::Rng;
use std::error::Error;
use std::path::{Path, PathBuf};

const TOKENS: [usize; 3] = [64, 8, 1];
const STEPS_PER_PASS: usize = 20;
const WARMUP: usize = 5;
const REPS: usize = 50;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

fn write_raw(dir: &Path, name: &str, bytes: impl Iterator<Item = [u8; 2]>) -> Result<()> {
    std::fs::write(dir.join(name), bytes.flatten().collect::<Vec<u8>>())?;
    Ok(())
}

/// A layer's inputs (64 tokens), with `inputs`, and a schedule's routing and output under its
/// `label`, for moe-torch.py.
fn dump(dir: &Path, name: &str, moe: &Moe, inputs: bool, label: &str, (out, ids, gates): &(Vec<f32>, Vec<u32>, Vec<f32>)) -> Result<()> {
    let dir = dir.join(name);
    std::fs::create_dir_all(&dir)?;
    if inputs {
        let l = moe.layer;
        let meta = format!(
            "{{\"tokens\": {}, \"hidden\": {}, \"experts\": {}, \"top_k\": {}, \"ffn\": {}, \"renormalize\": {}}}\n",
            moe.tokens, l.hidden, l.experts, l.top_k, l.ffn, l.renormalize
        );
        std::fs::write(dir.join("meta.json"), meta)?;
        for (file, values) in [("x", &moe.x), ("router", &moe.router), ("w_gate", &moe.w_gate), ("w_up", &moe.w_up), ("w_down", &moe.w_down)] {
            write_raw(&dir, &format!("{file}.bf16"), values.iter().map(|v| v.to_bits().to_le_bytes()))?;
        }
    }
    write_raw(&dir, &format!("out.{label}.bf16"), out.iter().map(|&v| bf16::from_f32(v).to_bits().to_le_bytes()))?;
    std::fs::write(dir.join(format!("ids.{label}.u32")), ids.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    std::fs::write(dir.join(format!("gates.{label}.f32")), gates.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?;
    Ok(())
}

/// A schedule's name in a dump's file names.
fn file_label(schedule: Schedule) -> &'static str {
    match schedule {
        Schedule::Pairs { .. } => "pairs",
        Schedule::Tokens => "tokens",
        Schedule::Dense => "dense",
        Schedule::Fused => "fused",
    }
}

fn main() -> Result<()> {
    let dump_dir = std::env::args().skip_while(|a| a != "--dump").nth(1).map(PathBuf::from);
    let only: Vec<String> = std::env::args().skip_while(|a| a != "--only").skip(1).take_while(|a| !a.starts_with("--")).take(2).collect();
    let ffn: Option<usize> = std::env::args().skip_while(|a| a != "--ffn").nth(1).map(|n| n.parse()).transpose()?;
    let cluster: Option<u32> = std::env::args().skip_while(|a| a != "--cluster").nth(1).map(|n| n.parse()).transpose()?;
    let counts: Vec<usize> = match only.get(1) {
        Some(t) => vec![t.parse().ok().filter(|t| (1..=TOKENS[0]).contains(t)).ok_or_else(|| format!("--only NAME [TOKENS]: TOKENS must be 1 to {}, not {t}", TOKENS[0]))?],
        None => TOKENS.to_vec(),
    };
    let wanted = |name: &str| only.is_empty() || name.starts_with(only[0].as_str());
    let Some(gpu) = gpu_or_skip("moe-bench") else { return Ok(()) };
    let kernels = Kernels::load(&gpu)?;
    let sms = multiprocessors(&gpu)?;
    let bandwidth = copy_bandwidth(&gpu)?;
    println!("copy bandwidth (cuMemcpyDtoD, 1 GiB): {:.2} TB/s", bandwidth / 1e12);
    let (mut rows, mut launches, mut timelines) = (Vec::new(), Vec::new(), Vec::new());
    for (name, layer) in [("Mixtral-8x7B", Layer::MIXTRAL_8X7B), ("DeepSeek-V2-Lite", Layer::DEEPSEEK_V2_LITE)] {
        let layer = Layer { ffn: ffn.unwrap_or(layer.ffn), ..layer };
        if !wanted(name) {
            continue;
        }
        eprintln!("{name}: generating weights ({:.1} GB) ...", layer.experts as f64 * layer.expert_bytes() as f64 / 1e9);
        let mut moe = Moe::random(layer, TOKENS[0], with_rng(|rng| rng.random()))?;
        for &tokens in &counts {
            moe.x.truncate(tokens * layer.hidden);
            moe.tokens = tokens;
            eprintln!("{name}, {tokens} tokens: f64 reference and runs ...");
            let reference = Reference::new(&moe);
            let selected = reference.selected(layer.experts);
            let roofline_us = layer.step_bytes(tokens, selected) as f64 / bandwidth * 1e6;
            let planned = schedule(&layer, tokens, sms);
            let dense = (tokens * layer.top_k >= layer.experts).then_some(Schedule::Dense);
            let fused = (tokens <= FUSED_MAX_TOKENS).then_some(Schedule::Fused);
            let others = [Some(Schedule::pairs(&layer, tokens)), Some(Schedule::Tokens), dense, fused].into_iter().flatten().filter(|&s| s != planned);
            let label = ffn.map_or(name.to_string(), |f| format!("{name} (FFN {f})"));
            let prefix = format!("| {label} | {tokens} | {selected} of {} |", layer.experts);
            for schedule in std::iter::once(planned).chain(others) {
                // A row that fails to launch or to check costs its rows, not the run's.
                let mut run = || -> Result<()> {
                    let cluster = cluster.map_or_else(|| gate_up_cluster(&kernels, &gpu, layer, tokens, schedule), Ok)?;
                    let plan = plan_schedule(&kernels, &gpu, layer, tokens, cluster, true, schedule)?;
                    let (down_blocks, down_cluster) = plan.down.map_or((0, 0), |d| (d.grid.x, d.cluster.map_or(1, |c| c.x)));
                    let mut b = Buffers::upload(&gpu, &moe)?;
                    step(&kernels, gpu.stream(), &mut b, &plan)?;
                    let first = b.results(&gpu)?;
                    // The busiest expert's pairs: past a group, its weights are read again.
                    let busiest = (0..layer.experts as u32).map(|e| first.1.iter().filter(|&&id| id == e).count()).max().unwrap_or(0);
                    let mark = if schedule == planned { "planned " } else { "" };
                    let layout = format!("{mark}{schedule:?}: {} + {} blocks, clusters of {cluster} and {down_cluster}, busiest expert {busiest} pairs", plan.gate_up.grid.x, down_blocks);
                    // The planned schedule runs first: it writes the inputs too.
                    if let (Some(dir), true) = (&dump_dir, tokens == TOKENS[0]) {
                        dump(dir, name, &moe, schedule == planned, file_label(schedule), &first)?;
                    }
                    b.poison(&gpu)?;
                    // Captured after `poison`, which reallocates the outputs: `b` is not changed again.
                    let graph = gpu.capture(|s| step(&kernels, s, &mut b, &plan))?;
                    // SAFETY: the graph holds `b`'s buffers, alive and unchanged until `b` drops,
                    // after the graph.
                    unsafe { graph.replay(gpu.stream())? };
                    let second = b.results(&gpu)?;
                    let mismatches = reference.routing_mismatches(&first.1, layer.experts);
                    let report = Report::new(String::new(), &first.0.iter().chain(&first.2).copied().collect::<Vec<_>>(), &reference.out.iter().chain(&reference.gates).copied().collect::<Vec<_>>(), TOLERANCE);
                    let same = first.0.iter().zip(&second.0).all(|(a, b)| a.to_bits() == b.to_bits()) && first.1 == second.1;
                    if !report.passed() || !same || !mismatches.is_empty() {
                        eprintln!("FAIL {name} at {tokens} tokens: {report:?}, deterministic {same}, routing mismatches {mismatches:?}");
                        rows.push(format!("{prefix} clusterfuse ({layout}) | FAIL | {roofline_us:.1} | – | {:.2e} |", report.rel_error));
                        return Ok(());
                    }
                    let launched = median_us_per_call(&gpu, (WARMUP, REPS), STEPS_PER_PASS, |_| step(&kernels, gpu.stream(), &mut b, &plan))?;
                    // SAFETY: as above.
                    let replayed = median_us_per_call(&gpu, (WARMUP, REPS), STEPS_PER_PASS, |_| unsafe { graph.replay(gpu.stream()) })?;
                    let variants = if plan.down.is_some() { ["2 launches, PDL", "CUDA graph of the 2, PDL"] } else { ["1 launch", "CUDA graph of the 1"] };
                    for (variant, us) in variants.into_iter().zip([launched, replayed]) {
                        rows.push(format!("{prefix} clusterfuse {variant} ({layout}) | {us:.1} | {roofline_us:.1} | {:.0}% | {:.2e} |", roofline_us / us * 100.0, report.rel_error));
                    }
                    // Where the time goes: each launch alone.
                    let (gate_up_us, down_us) = alone(&gpu, &kernels, &plan, &mut b)?;
                    launches.push(format!("{prefix} {mark}{schedule:?} | {gate_up_us:.1} | {down_us:.1} |"));
                    // The graph is not replayed after this: `record_timeline` replaces buffers.
                    b.record_timeline(&gpu, &plan)?;
                    step(&kernels, gpu.stream(), &mut b, &plan)?;
                    if let Some(Timeline { gate_up: g, cluster_logits, down, .. }) = b.timeline(&gpu, &plan)? {
                        let d = down.map_or_else(|| String::from("– | – | –"), |d| format!("{:.1} | {:.1} | {:.1}", d[0], d[1], d[2]));
                        timelines.push(format!("{prefix} {mark}{schedule:?} | {:.1} | {:.1} | {cluster_logits:.1} | {:.1} | {:.1} | {d} |", g[0], g[1], g[2], g[3]));
                    }
                    Ok(())
                };
                if let Err(err) = run() {
                    eprintln!("ERROR {name} at {tokens} tokens, {schedule:?}: {err}");
                    rows.push(format!("{prefix} clusterfuse {schedule:?} | ERROR: {err} | {roofline_us:.1} | – | – |"));
                }
            }
        }
    }
    println!(
        "{} — MoE layer, bf16; median of {REPS} passes of {STEPS_PER_PASS} steps (CUDA events), µs per step; roofline = router + selected experts' weights + x + y over {:.2} TB/s (measured copy bandwidth)",
        gpu.name()?,
        bandwidth / 1e12
    );
    println!("| layer | tokens | experts used | variant | µs | roofline µs | % of roofline | rel error vs f64 |");
    println!("|---|---|---|---|---|---|---|---|");
    print_rows(&rows)?;
    println!("\nEach launch alone (µs; the down kernel in stream order, not programmatic; NaN: the fused schedule has none):");
    println!("| layer | tokens | experts used | schedule | gate/up | down |");
    println!("|---|---|---|---|---|---|");
    print_rows(&launches)?;
    println!("\nWhere one step's time goes (µs from the first gate/up block's start, `%globaltimer` stamps of every block: means over blocks, ends of the last one; launched with PDL):");
    println!("| layer | tokens | experts used | schedule | gate/up start | router logits | a cluster's last logits | routing ready | gate/up end | down start | routing received | down end |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    print_rows(&timelines)?;
    Ok(())
}

/// µs of the gate/up launch alone, then of the down launch alone (in stream order; NaN where
/// the plan has none).
fn alone(gpu: &Gpu, kernels: &Kernels, plan: &Plan, b: &mut Buffers) -> Result<(f64, f64)> {
    let first = median_us_per_call(gpu, (WARMUP, REPS), STEPS_PER_PASS, |_| gate_up(kernels, gpu.stream(), b, plan))?;
    let Some(config) = plan.down else { return Ok((first, f64::NAN)) };
    let ordered = Plan { down: Some(LaunchConfig { programmatic: false, ..config }), ..*plan };
    Ok((first, median_us_per_call(gpu, (WARMUP, REPS), STEPS_PER_PASS, |_| down(kernels, gpu.stream(), b, &ordered))?))
}
