//! Fused against unfused: LayerNorm(x + b) → GELU and RMSNorm(x + residual) (example 08),
//! fp16, for hidden ∈ {768, 1024, 4096, 8192} × rows ∈ {1, 64, 512, 4096}.
//!
//! Each repetition times, with CUDA events, one pass of at least 20 calls launched back to
//! back (as `gemm-bench` does, so that the CPU's launch cost is hidden and not counted),
//! rotating over `copies` copies of the inputs and outputs, and reports the time per call;
//! the median of 50 repetitions, after 5 warm-up passes. There are enough copies that one
//! rotation touches at least 2 × the H200's 60 MB L2 (a single copy once it alone is twice
//! the L2, which then serves every call of the pass), except that at most 256 copies are
//! made: shapes under ~470 KB (rows = 1, and rows = 64 at hidden ≤ 1024) stay partly
//! L2-resident, and the table says how many copies each row used. Roofline = bytes that must
//! move / the card's copy bandwidth, measured first (`check::copy_bandwidth`).
//!
//! Every variant runs twice: in plain stream order, where each call starts once the previous
//! one has drained (the GPU's launch gap and the grid's tail are counted), and with
//! programmatic dependent launch ("PDL"), where each call's blocks take the SMs the previous
//! call's last blocks leave and wait there for it to complete (every kernel of example 08
//! waits for its predecessor before reading) — how the kernels run in a model launched with
//! PDL.
//!
//! `cargo run --release -p clusterfuse-examples --bin norms-bench`

use clusterfuse::f16;
use clusterfuse::host::{Gpu, LaunchConfig};
use clusterfuse_kernels::norms::{add_bias, add_residual, gelu_kernel, layer_norm, rms_norm, row_config, Fused};
use clusterfuse_examples::check::{copy_bandwidth, gpu_or_skip, median_us_per_call};
use std::error::Error;

const HIDDEN: [u32; 4] = [768, 1024, 4096, 8192];
const ROWS: [u32; 4] = [1, 64, 512, 4096];
const L2_BYTES: usize = 60 << 20;
const MAX_SETS: usize = 256;
/// Calls per timed pass, at least.
const MIN_CALLS: usize = 20;
const WARMUP: usize = 5;
const REPS: usize = 50;

type Result<T> = std::result::Result<T, Box<dyn Error>>;


/// Median µs per call of `call(set)` over passes of at least [`MIN_CALLS`] calls, rotating
/// over the `sets` copies.
fn time(gpu: &Gpu, sets: usize, mut call: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    median_us_per_call(gpu, (WARMUP, REPS), sets.max(MIN_CALLS), |i| call(i % sets))
}

#[allow(clippy::too_many_arguments)]
fn row(bandwidth: f64, op: &str, hidden: u32, rows: u32, variant: &str, kernels: u32, sets: usize, us: f64, bytes: f64) {
    let roofline_us = bytes / bandwidth * 1e6;
    println!(
        "| {op} | {hidden} | {rows} | {variant} | {kernels} | {sets} | {us:.2} | {:.0} | {:.1}% |",
        bytes / us * 1e-3,
        roofline_us / us * 100.0
    );
}

fn main() -> Result<()> {
    let Some(gpu) = gpu_or_skip("norms-bench") else {
        return Ok(());
    };
    let s = gpu.stream();
    let fused = Fused::load(&gpu)?;
    let (k_bias, k_ln, k_gelu, k_add, k_rms) =
        (add_bias::load(&gpu)?, layer_norm::load(&gpu)?, gelu_kernel::load(&gpu)?, add_residual::load(&gpu)?, rms_norm::load(&gpu)?);
    let bandwidth = copy_bandwidth(&gpu)?;
    println!("{} — fp16, median of {REPS} passes (CUDA events), µs per call; roofline {:.2} TB/s (measured copy bandwidth)", gpu.name()?, bandwidth / 1e12);
    println!("| op | hidden | rows | variant | kernels | copies | µs | GB/s | % roofline |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for hidden in HIDDEN {
        for rows in ROWS {
            let (n, h) = (rows as usize * hidden as usize, hidden as usize);
            let values = |len: usize| -> Vec<f16> { (0..len).map(|i| f16::from_f32(((i * 7919) % 2001) as f32 / 1000.0 - 1.0)).collect() };
            let (x, col) = (values(n), values(h));
            let config = row_config(hidden, rows);
            let pdl = |config: LaunchConfig| LaunchConfig { programmatic: true, ..config };

            // LayerNorm(x + b) → GELU: x in, out out (+ b, γ, β).
            let bytes = (2 * n * 2 + 3 * h * 2) as f64;
            let sets = (2 * L2_BYTES).div_ceil(bytes as usize).clamp(1, MAX_SETS);
            let upload = |v: &[f16], k: usize| (0..k).map(|_| gpu.upload(v)).collect::<std::result::Result<Vec<_>, _>>();
            let (xs, bs, gs, betas) = (upload(&x, sets)?, upload(&col, sets)?, upload(&col, sets)?, upload(&col, sets)?);
            let (mut outs, mut ys, mut zs) = (upload(&x, sets)?, upload(&x, sets)?, upload(&x, sets)?);
            for (programmatic, variant) in [(false, "fused"), (true, "fused, PDL")] {
                let us = time(&gpu, sets, |i| Ok(fused.layernorm_gelu(s, programmatic, &xs[i], &bs[i], &gs[i], &betas[i], &mut outs[i], hidden, rows)?))?;
                row(bandwidth, "LayerNorm(x+b)→GELU", hidden, rows, variant, 1, sets, us, bytes);
            }
            for (config, unfused) in [(config, "unfused"), (pdl(config), "unfused, PDL")] {
                let us = time(&gpu, sets, |i| {
                    k_bias.launch(s, &config, &xs[i], &bs[i], &mut ys[i])?;
                    k_ln.launch(s, &config, &ys[i], &gs[i], &betas[i], &mut zs[i], hidden)?;
                    Ok(k_gelu.launch(s, &config, &zs[i], &mut outs[i])?)
                })?;
                row(bandwidth, "LayerNorm(x+b)→GELU", hidden, rows, unfused, 3, sets, us, bytes);
            }
            drop((xs, bs, gs, betas, outs, ys, zs));

            // RMSNorm(x + r): x, r in; residual, out out (+ w).
            let bytes = (4 * n * 2 + h * 2) as f64;
            let sets = (2 * L2_BYTES).div_ceil(bytes as usize).clamp(1, MAX_SETS);
            let (xs, rs, ws) = (upload(&x, sets)?, upload(&x, sets)?, upload(&col, sets)?);
            let (mut res, mut outs) = (upload(&x, sets)?, upload(&x, sets)?);
            for (programmatic, variant) in [(false, "fused"), (true, "fused, PDL")] {
                let us = time(&gpu, sets, |i| Ok(fused.add_rmsnorm(s, programmatic, &xs[i], &rs[i], &ws[i], &mut res[i], &mut outs[i], hidden, rows)?))?;
                row(bandwidth, "RMSNorm(x+r)", hidden, rows, variant, 1, sets, us, bytes);
            }
            for (config, unfused) in [(config, "unfused"), (pdl(config), "unfused, PDL")] {
                let us = time(&gpu, sets, |i| {
                    k_add.launch(s, &config, &xs[i], &rs[i], &mut res[i])?;
                    Ok(k_rms.launch(s, &config, &res[i], &ws[i], &mut outs[i], hidden)?)
                })?;
                row(bandwidth, "RMSNorm(x+r)", hidden, rows, unfused, 2, sets, us, bytes);
            }
        }
    }
    Ok(())
}
