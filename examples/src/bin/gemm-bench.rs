//! The tensor-core GEMMs of example 10 (`mma.sync`) and example 12 (`wgmma` fed by TMA), bf16
//! in, f32 accumulate, bf16 out, plain and with the bias + GELU epilogue fused, on 4096³, 8192³, BERT-base's shapes (M = 128 ×
//! batch 1, 8, 32; N × K = 768 × 768, 3072 × 768, 768 × 3072) and Llama-2-7B's projections
//! (M = 1, 8, 64, 512; N × K = 4096 × 4096, 11008 × 4096, 4096 × 11008).
//! `scripts/gemm-torch.py` times cuBLAS (through `torch.matmul`) on the same shapes.
//!
//! Each row: the median of 20 passes (CUDA events) after 3 warm-up passes, each pass
//! `calls` launches back to back (more for small shapes, so that a pass takes ~1 ms), time per
//! call; TFLOP/s counts 2·M·N·K. Before timing, 256 random entries of the output are checked
//! against an f64 reference; a row that fails says so and the binary exits non-zero.
//!
//! `cargo run --release -p clusterfuse-examples --bin gemm-bench`

use clusterfuse::bf16;
use clusterfuse::host::Buffer;
use clusterfuse_kernels::gemm::{EpilogueKind, GemmType, HostOperands, Operands};
use clusterfuse_kernels::wgmma_gemm::{self, Maps};
use rand::Rng;
use clusterfuse_examples::check::{gpu_or_skip, median_us_per_call, with_rng};
use std::error::Error;
use std::process::ExitCode;

const WARMUP: usize = 3;
const REPS: usize = 20;
const SAMPLES: usize = 256;
/// Relative error allowed per sampled entry (the output's bf16 rounding, at most 2^-8 of
/// itself, with room for the f32 accumulation and `tanh.approx`).
const TOLERANCE: f64 = 1e-2;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

/// (workload, M, N, K).
fn shapes() -> Vec<(&'static str, usize, usize, usize)> {
    let mut shapes = vec![("square", 4096, 4096, 4096), ("square", 8192, 8192, 8192)];
    for batch in [1, 8, 32] {
        for (n, k) in [(768, 768), (3072, 768), (768, 3072)] {
            shapes.push(("BERT-base", 128 * batch, n, k));
        }
    }
    for m in [1, 8, 64, 512] {
        for (n, k) in [(4096, 4096), (11008, 4096), (4096, 11008)] {
            shapes.push(("Llama-2-7B", m, n, k));
        }
    }
    shapes
}


/// Worst relative error of `SAMPLES` random entries of `out`, each against its own
/// magnitude plus the reference's typical one (so that entries near zero do not dominate,
/// and large ones are held to their own rounding: a bf16 output is within 2^-8 of itself).
fn sampled_error(host: &HostOperands<bf16>, out: &[bf16], epilogue: EpilogueKind, (m, n, k): (usize, usize, usize)) -> f64 {
    let mut rng = rand::rng();
    let picks: Vec<(usize, usize)> = (0..SAMPLES).map(|_| (rng.random_range(0..m), rng.random_range(0..n))).collect();
    let reference: Vec<f64> = picks.iter().map(|&(i, j)| epilogue.reference(host.dot(i, j, n, k), i, j, n, host)).collect();
    let scale = (reference.iter().map(|r| r * r).sum::<f64>() / SAMPLES as f64).sqrt().max(f64::MIN_POSITIVE);
    picks
        .iter()
        .zip(&reference)
        .map(|(&(i, j), r)| {
            let o = out[i * n + j].to_f64();
            if o.is_nan() { f64::INFINITY } else { (o - r).abs() / (r.abs() + scale) }
        })
        .fold(0.0, f64::max)
}

fn main() -> ExitCode {
    match bench() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("some outputs did not match their reference");
            ExitCode::FAILURE
        }
        Err(err) => {
            eprintln!("gemm-bench: {err}");
            ExitCode::FAILURE
        }
    }
}

fn bench() -> Result<bool> {
    let Some(gpu) = gpu_or_skip("gemm-bench") else {
        return Ok(true);
    };
    let kernels = bf16::load(&gpu)?;
    let wgmma = wgmma_gemm::Kernels::load(&gpu)?;
    println!("{} — clusterfuse GEMMs (mma.sync: example 10; wgmma: example 12, Bᵀ given N × K), bf16 in / f32 accumulate / bf16 out; median of {REPS} passes (CUDA events), µs per call", gpu.name()?);
    println!("| workload | M | N | K | kernel | epilogue | calls | µs | TFLOP/s | max rel error ({SAMPLES} samples) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut all_passed = true;
    for (workload, m, n, k) in shapes() {
        let host = with_rng(|rng| HostOperands::<bf16>::random(rng, m, n, k));
        let x = Operands::upload(&gpu, &host)?;
        let mut out = gpu.upload(&vec![bf16::NAN; m * n])?;
        let flops = 2.0 * (m * n * k) as f64;
        // About 1 ms of work per pass at 300 TFLOP/s, and at least 20 calls, so that small
        // GEMMs are timed back to back rather than one launch after an idle GPU.
        let calls = (3e8 / flops).ceil().clamp(20.0, 200.0) as usize;
        let bt = gpu.upload(&wgmma_gemm::transpose(&host.b, k, n))?;
        let maps = Maps::new(&gpu, &x.a, &bt, (m, n, k))?;
        for epilogue in [EpilogueKind::None, EpilogueKind::BiasGelu] {
            for kernel in ["mma.sync", "wgmma"] {
                let launch = |out: &mut Buffer<bf16>| -> Result<()> {
                    match kernel {
                        "wgmma" => wgmma.launch(&gpu, epilogue, &maps, &x, out, (m, n, k))?,
                        _ => bf16::launch(&kernels, &gpu, epilogue, &x, out, m, n, k)?,
                    }
                    Ok(())
                };
                launch(&mut out)?;
                let error = sampled_error(&host, &gpu.download(&out)?, epilogue, (m, n, k));
                let passed = error <= TOLERANCE;
                all_passed &= passed;
                let us = median_us_per_call(&gpu, (WARMUP, REPS), calls, |_| launch(&mut out))?;
                let verdict = if passed { "" } else { " FAIL" };
                println!(
                    "| {workload} | {m} | {n} | {k} | {kernel} | {} | {calls} | {us:.1} | {:.1} | {error:.1e}{verdict} |",
                    epilogue.name(),
                    flops / us * 1e-6
                );
            }
        }
    }
    Ok(all_passed)
}
