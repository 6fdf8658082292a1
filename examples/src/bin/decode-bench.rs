//! The decode-step attention block of Llama-2-7B (hidden 4096, 32 heads of 128, fp16, batch 1)
//! at KV lengths 1024, 4096 and 16384: the fused kernel of example 09 (one launch) with
//! clusters of 8 and 16, and the same stages as five separate kernels.
//!
//! Every variant is first checked at every length against the f64 reference of the whole
//! block (fresh random weights and cache each run; `out` poisoned; relative error ≤ 2e-3 over
//! `out` and the appended k, v) and run twice for bitwise-equal outputs; only a variant that
//! passes is timed. Timing: CUDA events around a pass of 20 back-to-back steps, the median of
//! 50 passes after 5 warm-up passes, µs per step. Weights (134 MB) plus cache exceed the 60 MB
//! L2 at every length, so one set of buffers is used: each step reads them from HBM. Roofline
//! = bytes that must move (weights, cache tokens 0..pos, the new k/v, x and out) / 4.3 TB/s.
//!
//! `--dump DIR` also writes the L = 1024 inputs and the fused kernel's results as raw
//! little-endian files for `scripts/decode-torch.py --check DIR`.
//!
//! `cargo run --release -p clusterfuse-examples --bin decode-bench [-- --dump DIR]`

use clusterfuse::f16;
use clusterfuse::host::Gpu;
use clusterfuse_examples::check::{Report, median, gpu_or_skip};
use clusterfuse_examples::decode_attention::host::{Buffers, Launchers, Step};
use clusterfuse_examples::decode_attention::HEAD_DIM;
use std::error::Error;
use std::path::{Path, PathBuf};

const HIDDEN: usize = 4096;
const LENGTHS: [usize; 3] = [1024, 4096, 16384];
const CLUSTERS: [u32; 2] = [8, 16];
const SEPARATE_CLUSTER: u32 = 8;
const PEAK_BYTES_PER_S: f64 = 4.3e12;
const TOLERANCE: f64 = 2e-3;
const STEPS_PER_PASS: usize = 20;
const WARMUP: usize = 5;
const REPS: usize = 50;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

#[derive(Clone, Copy)]
enum Variant {
    Fused(u32),
    Separate(u32),
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Fused(_) => "clusterfuse fused",
            Variant::Separate(_) => "clusterfuse separate",
        }
    }

    fn kernels(self) -> u32 {
        match self {
            Variant::Fused(_) => 1,
            Variant::Separate(_) => 5,
        }
    }

    fn cluster(self) -> u32 {
        match self {
            Variant::Fused(c) | Variant::Separate(c) => c,
        }
    }

    fn launch(self, gpu: &Gpu, launchers: &Launchers, b: &mut Buffers, step: &Step) -> Result<()> {
        match self {
            Variant::Fused(c) => launchers.fused(gpu, b, step, c)?,
            Variant::Separate(c) => launchers.separate(gpu, b, step, c)?,
        }
        Ok(())
    }
}


/// Bytes one step must move at position `pos` (tokens `0 ..= pos` attended).
fn bytes(step: &Step) -> f64 {
    let h = step.hidden;
    let weights = (4 * h * h + h) * 2;
    let cache = 2 * step.heads() * (step.pos + 1) * HEAD_DIM * 2;
    (weights + cache + 2 * h * 2) as f64
}

fn write_f16(dir: &Path, name: &str, values: &[f16]) -> Result<()> {
    let raw: Vec<u8> = values.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    std::fs::write(dir.join(name), raw)?;
    Ok(())
}

/// The step's inputs (cache tokens `0 .. pos` only) and a variant's `out` and appended k, v.
fn dump(dir: &Path, step: &Step, results: &[f32]) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = format!(
        "{{\"hidden\": {}, \"heads\": {}, \"head_dim\": {HEAD_DIM}, \"pos\": {}, \"eps\": {}, \"theta\": {}}}\n",
        step.hidden,
        step.heads(),
        step.pos,
        clusterfuse_examples::decode_attention::EPS,
        clusterfuse_examples::decode_attention::THETA
    );
    std::fs::write(dir.join("meta.json"), meta)?;
    for (name, values) in [("x", &step.x), ("norm_w", &step.norm_w), ("w_qkv", &step.w_qkv), ("w_o", &step.w_o)] {
        write_f16(dir, &format!("{name}.f16"), values)?;
    }
    for (name, cache) in [("k_cache", &step.k_cache), ("v_cache", &step.v_cache)] {
        let valid: Vec<f16> = (0..step.heads()).flat_map(|h| cache[h * step.max_len * HEAD_DIM..][..step.pos * HEAD_DIM].iter().copied()).collect();
        write_f16(dir, &format!("{name}.f16"), &valid)?;
    }
    let halves: Vec<f16> = results.iter().map(|&v| f16::from_f32(v)).collect();
    let (out, appended) = halves.split_at(step.hidden);
    write_f16(dir, "out.f16", out)?;
    write_f16(dir, "k_new.f16", &appended[..step.hidden])?;
    write_f16(dir, "v_new.f16", &appended[step.hidden..])?;
    Ok(())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dump_dir: Option<PathBuf> = args.iter().position(|a| a == "--dump").map(|i| args.get(i + 1).expect("--dump needs a directory").into());
    let Some(gpu) = gpu_or_skip("decode-bench") else {
        return Ok(());
    };
    let launchers = Launchers::load(&gpu)?;
    let max_len = LENGTHS[LENGTHS.len() - 1];
    eprintln!("generating weights and a {max_len}-token cache ...");
    let mut step = Step::random(HIDDEN, max_len, max_len - 1);
    for cluster in CLUSTERS {
        let resident = launchers.fused_max_active_clusters(&gpu, &step, cluster)?;
        eprintln!("fused, clusters of {cluster}: {resident} resident at once (the grid has {})", step.heads());
    }
    let variants: Vec<Variant> = CLUSTERS.iter().map(|&c| Variant::Fused(c)).chain([Variant::Separate(SEPARATE_CLUSTER)]).collect();
    let mut rows = Vec::new();
    let mut failures = 0;
    for len in LENGTHS {
        step.set_pos(len - 1);
        eprintln!("L = {len}: f64 reference ...");
        let reference = step.reference();
        let expected: Vec<f64> = reference.out.iter().chain(&reference.k_new).chain(&reference.v_new).copied().collect();
        let roofline_us = bytes(&step) / PEAK_BYTES_PER_S * 1e6;
        for &variant in &variants {
            // Fresh buffers: a step rewrites the cache at `pos`, which a longer L reads.
            let mut b = Buffers::upload(&gpu, &step)?;
            variant.launch(&gpu, &launchers, &mut b, &step)?;
            let first = b.results(&gpu, &step)?;
            b.poison(&gpu)?;
            variant.launch(&gpu, &launchers, &mut b, &step)?;
            let second = b.results(&gpu, &step)?;
            let report = Report::new(format!("L {len}"), &first, &expected, TOLERANCE);
            let deterministic = first.iter().zip(&second).all(|(a, b)| a.to_bits() == b.to_bits());
            let label = format!("{} (cluster {})", variant.name(), variant.cluster());
            if !report.passed() || !deterministic {
                failures += 1;
                eprintln!("FAIL {label} at L {len}: {report:?} deterministic: {deterministic}");
                rows.push(format!("| {len} | {label} | {} | FAIL | {roofline_us:.1} | – | {:.2e} |", variant.kernels(), report.rel_error));
                continue;
            }
            if let (Some(dir), 1024, Variant::Fused(8)) = (&dump_dir, len, variant) {
                dump(dir, &step, &first)?;
            }
            let mut samples = Vec::new();
            for rep in 0..WARMUP + REPS {
                let ms = gpu.time_ms(|| (0..STEPS_PER_PASS).try_for_each(|_| variant.launch(&gpu, &launchers, &mut b, &step)))?;
                if rep >= WARMUP {
                    samples.push(ms * 1e3 / STEPS_PER_PASS as f64);
                }
            }
            let us = median(samples);
            rows.push(format!(
                "| {len} | {label} | {} | {us:.1} | {roofline_us:.1} | {:.0}% | {:.2e} |",
                variant.kernels(),
                roofline_us / us * 100.0,
                report.rel_error
            ));
        }
    }
    println!(
        "{} — Llama-2-7B decode attention block (hidden {HIDDEN}, {} heads × {HEAD_DIM}, fp16, batch 1); median of {REPS} passes of {STEPS_PER_PASS} steps (CUDA events), µs per step; roofline = bytes / {:.1} TB/s",
        gpu.name()?,
        step.heads(),
        PEAK_BYTES_PER_S / 1e12
    );
    println!("| L | variant | kernels | µs | roofline µs | % of roofline | rel error vs f64 |");
    println!("|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    if failures > 0 {
        return Err(format!("{failures} variant(s) failed their check").into());
    }
    Ok(())
}
