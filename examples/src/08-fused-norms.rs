//! 08 — fused kernels: LayerNorm(x + b) → GELU (BERT's epilogue) and RMSNorm(x + residual)
//! (Llama's, which also writes the new residual), each written as stages that
//! `#[fused_kernel]` composes into one kernel, and the same stages launched as separate
//! kernels, as a framework would. One block per row with one thread per 16-byte vector
//! (`block = hidden / 8`): each thread keeps its 8 values in registers, so x is read from
//! global memory once, and small blocks of few registers keep many rows in flight per SM.

use clusterfuse::prelude::*;

/// Halves per thread: one 16-byte vector.
pub const VECTOR: u32 = 8;
/// The largest hidden size: 1024 threads × 8 halves.
pub const MAX_HIDDEN: u32 = 1024 * VECTOR;
/// ε of both norms.
pub const EPS: f32 = 1e-5;

/// One thread's share of a row in f32: elements `8 t .. 8 t + 8` of thread `t`.
pub type Row = [f32; 8];

/// The launch of one row per block for the unfused kernels (the fused ones have `config`).
#[cfg(not(target_arch = "nvptx64"))]
pub fn row_config(hidden: u32, rows: u32) -> LaunchConfig {
    LaunchConfig { grid: rows.into(), block: (hidden / VECTOR).into(), ..LaunchConfig::default() }
}

/// Index, in 16-byte vectors, of this thread's vector of this block's row.
#[inline(always)]
fn vector() -> usize {
    block::index_x() as usize * block::size() as usize + thread::index_x() as usize
}

/// This thread's vector of a per-column parameter (bias, γ, β, weight), in f32.
#[inline(always)]
fn column(param: &[f16]) -> Row {
    widen(global::load16::<f16, 8>(param, thread::index_x() as usize))
}

#[inline(always)]
fn widen(halves: [f16; 8]) -> Row {
    let mut values = [0.0; 8];
    for k in 0..8 {
        values[k] = halves[k].to_f32();
    }
    values
}

/// This thread's vector of this block's row of `x` (one read of global memory), in f32.
#[inline(always)]
pub fn load_row(x: &[f16]) -> Row {
    widen(global::load16::<f16, 8>(x, vector()))
}

/// Writes this thread's vector of the row to `out` in f16, 16 bytes at once.
#[inline(always)]
pub fn store_row(row: Row, out: &Out<f16>) {
    let mut halves = [f16::from_f32(0.0); 8];
    for k in 0..8 {
        halves[k] = f16::from_f32(row[k]);
    }
    out.store16(vector(), halves);
}

/// Σ over this thread's values of `f(value)`.
#[inline(always)]
fn thread_sum(row: &Row, f: impl Fn(f32) -> f32) -> f32 {
    row.iter().fold(0.0, |sum, &v| sum + f(v))
}

/// erf(x) (Abramowitz & Stegun 7.1.26, |error| < 1.5e-7).
#[allow(clippy::excessive_precision)] // the published coefficients
#[inline(always)]
fn erf(x: f32) -> f32 {
    let a = if x < 0.0 { -x } else { x };
    let t = math::rcp(0.3275911f32.fma(a, 1.0));
    let poly = t * 1.061405429f32.fma(t, -1.453152027).fma(t, 1.421413741).fma(t, -0.284496736).fma(t, 0.254829592);
    let r = 1.0 - poly * math::exp(-a * a);
    if x < 0.0 {
        -r
    } else {
        r
    }
}

/// GELU with the exact erf, as BERT and `torch.nn.functional.gelu` define it.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * core::f32::consts::FRAC_1_SQRT_2))
}

/// `out = GELU(LayerNorm(x + b) · γ + β)` for `rows × hidden` (row-major; hidden a multiple of
/// 256, at most 8192).
#[fused_kernel(grid = rows, block = hidden / 8, launch_bounds(max_threads = 1024))]
pub mod layernorm_gelu {
    use super::*;

    /// y = x + b, kept in registers.
    #[stage(thread)]
    pub fn add_bias(x: Global<&[f16]>, b: Global<&[f16]>) -> Registers<Row> {
        let (mut y, b) = (load_row(x), column(b));
        for k in 0..8 {
            y[k] += b[k];
        }
        y
    }

    /// (y − μ) / √(σ² + ε) · γ + β, the mean and variance reduced over the block.
    #[stage(block)]
    pub fn layer_norm(y: Registers<Row>, gamma: Global<&[f16]>, beta: Global<&[f16]>, hidden: u32) -> Registers<Row> {
        let scratch = shared!([f32; 32]);
        // The parameters' loads go out before the reductions wait on their barriers.
        let (g, b) = (column(gamma), column(beta));
        let n = hidden as f32;
        let mean = block::reduce_sum(thread_sum(&y, |v| v), scratch) / n;
        let rstd = math::rsqrt(block::reduce_sum(thread_sum(&y, |v| (v - mean) * (v - mean)), scratch) / n + EPS);
        let mut z = [0.0; 8];
        for k in 0..8 {
            z[k] = ((y[k] - mean) * rstd).fma(g[k], b[k]);
        }
        z
    }

    /// out = GELU(z), written as f16.
    #[stage(thread)]
    pub fn gelu_out(mut z: Registers<Row>, out: Global<Out<f16>>) {
        for value in &mut z {
            *value = gelu(*value);
        }
        store_row(z, out);
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    pub fn kernel(x: &[f16], b: &[f16], gamma: &[f16], beta: &[f16], out: Out<f16>, hidden: u32, rows: u32) {
        let y = add_bias(x, b);
        let z = layer_norm(y, gamma, beta, hidden);
        gelu_out(z, out);
    }
}

/// `h = x + r` (rounded to f16, written to `residual_out`), then
/// `out = h / √(mean(h²) + ε) · w`, for `rows × hidden` (as for `layernorm_gelu`).
#[fused_kernel(grid = rows, block = hidden / 8, launch_bounds(max_threads = 1024, min_blocks = 2))]
pub mod add_rmsnorm {
    use super::*;

    /// h = f16(x + r): the next layer's residual, written out and kept in registers.
    #[stage(thread)]
    pub fn add_residual(x: Global<&[f16]>, r: Global<&[f16]>, residual_out: Global<Out<f16>>) -> Registers<Row> {
        let (x, r) = (load_row(x), load_row(r));
        let mut h = [0.0; 8];
        for k in 0..8 {
            h[k] = f16::from_f32(x[k] + r[k]).to_f32();
        }
        store_row(h, residual_out);
        h
    }

    /// out = h · rsqrt(mean(h²) + ε) · w.
    #[stage(block)]
    pub fn rms_norm(h: Registers<Row>, weight: Global<&[f16]>, out: Global<Out<f16>>, hidden: u32) {
        let scratch = shared!([f32; 32]);
        let w = column(weight);
        let rstd = math::rsqrt(block::reduce_sum(thread_sum(&h, |v| v * v), scratch) / hidden as f32 + EPS);
        let mut y = [0.0; 8];
        for k in 0..8 {
            y[k] = h[k] * rstd * w[k];
        }
        store_row(y, out);
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    #[allow(clippy::too_many_arguments)]
    pub fn kernel(x: &[f16], residual: &[f16], weight: &[f16], residual_out: Out<f16>, out: Out<f16>, hidden: u32, rows: u32) {
        let h = add_residual(x, residual, residual_out);
        rms_norm(h, weight, out, hidden);
    }
}

// The same stages as separate kernels, one per stage, f16 intermediates in global memory.

/// Unfused 1/3: `y = x + b`.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn add_bias(x: &[f16], b: &[f16], y: Out<f16>) {
    store_row(layernorm_gelu::add_bias(x, b), &y);
}

/// Unfused 2/3: `z = LayerNorm(y) · γ + β`.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn layer_norm(y: &[f16], gamma: &[f16], beta: &[f16], z: Out<f16>, hidden: u32) {
    store_row(layernorm_gelu::layer_norm(load_row(y), gamma, beta, hidden), &z);
}

/// Unfused 3/3: `out = GELU(z)`.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn gelu_kernel(z: &[f16], out: Out<f16>) {
    layernorm_gelu::gelu_out(load_row(z), &out);
}

/// Unfused 1/2: `residual_out = x + r`.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn add_residual(x: &[f16], r: &[f16], residual_out: Out<f16>) {
    add_rmsnorm::add_residual(x, r, &residual_out);
}

/// Unfused 2/2: `out = RMSNorm(h) · w`.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn rms_norm(h: &[f16], weight: &[f16], out: Out<f16>, hidden: u32) {
    add_rmsnorm::rms_norm(load_row(h), weight, &out, hidden);
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod reference {
    //! f64 references of both fused kernels.

    /// erf(x) to about 1e-12: its Taylor series below 3, the asymptotic series of erfc above.
    pub fn erf(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 3.0 {
            let (mut term, mut sum, mut n) = (a, a, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -a * a / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let (mut term, mut series) = (1.0, 1.0);
            for n in 1..8 {
                term *= -(2.0 * n as f64 - 1.0) / (2.0 * a * a);
                series += term;
            }
            1.0 - (-a * a).exp() / (a * std::f64::consts::PI.sqrt()) * series
        };
        r.copysign(x)
    }

    /// GELU(LayerNorm(x + b) · γ + β), row by row.
    pub fn layernorm_gelu(x: &[f32], b: &[f32], gamma: &[f32], beta: &[f32], eps: f64) -> Vec<f64> {
        let hidden = b.len();
        x.chunks(hidden)
            .flat_map(|row| {
                let y: Vec<f64> = row.iter().zip(b).map(|(&x, &b)| x as f64 + b as f64).collect();
                let mean = y.iter().sum::<f64>() / hidden as f64;
                let var = y.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / hidden as f64;
                let rstd = 1.0 / (var + eps).sqrt();
                (0..hidden)
                    .map(|i| {
                        let z = (y[i] - mean) * rstd * gamma[i] as f64 + beta[i] as f64;
                        0.5 * z * (1.0 + erf(z / std::f64::consts::SQRT_2))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// RMSNorm(h) · w of the residual `h` (already rounded to f16, as the kernels store it).
    pub fn rmsnorm(h: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
        let hidden = w.len();
        h.chunks(hidden)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / hidden as f64;
                let rstd = 1.0 / (ms + eps).sqrt();
                row.iter().zip(w).map(move |(&v, &w)| v as f64 * rstd * w as f64)
            })
            .collect()
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{random, Report};
    let halves = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let floats = |v: &[f16]| -> Vec<f32> { v.iter().map(|h| h.to_f32()).collect() };
    let (ln_fused, rms_fused) = (layernorm_gelu::load(gpu)?, add_rmsnorm::load(gpu)?);
    let (k_bias, k_ln, k_gelu) = (add_bias::load(gpu)?, layer_norm::load(gpu)?, gelu_kernel::load(gpu)?);
    let (k_add, k_rms) = (add_residual::load(gpu)?, rms_norm::load(gpu)?);
    let (mut outs, mut refs) = (Vec::new(), Vec::new());
    let rows = 37u32;
    for hidden in [768u32, 1024, 2048, 4096, 8192] {
        let n = rows as usize * hidden as usize;
        let (x, r) = (halves(random(n)), halves(random(n)));
        let (b, gamma, beta, w) = (halves(random(hidden as usize)), halves(random(hidden as usize)), halves(random(hidden as usize)), halves(random(hidden as usize)));
        let (dx, dr, db, dg, dbeta, dw) = (gpu.upload(&x)?, gpu.upload(&r)?, gpu.upload(&b)?, gpu.upload(&gamma)?, gpu.upload(&beta)?, gpu.upload(&w)?);
        let poisoned = || gpu.upload(&vec![f16::NAN; n]);
        let s = gpu.stream();

        let ln_ref = reference::layernorm_gelu(&floats(&x), &floats(&b), &floats(&gamma), &floats(&beta), EPS as f64);
        let mut out = poisoned()?;
        ln_fused.launch(s, &layernorm_gelu::config(hidden, rows), &dx, &db, &dg, &dbeta, &mut out, hidden, rows)?;
        outs.extend(floats(&gpu.download(&out)?));
        refs.extend(&ln_ref);
        let (mut y, mut z, mut out) = (poisoned()?, poisoned()?, poisoned()?);
        let config = row_config(hidden, rows);
        k_bias.launch(s, &config, &dx, &db, &mut y)?;
        k_ln.launch(s, &config, &y, &dg, &dbeta, &mut z, hidden)?;
        k_gelu.launch(s, &config, &z, &mut out)?;
        outs.extend(floats(&gpu.download(&out)?));
        refs.extend(&ln_ref);

        let h: Vec<f32> = x.iter().zip(&r).map(|(a, b)| f16::from_f32(a.to_f32() + b.to_f32()).to_f32()).collect();
        let rms_ref = reference::rmsnorm(&h, &floats(&w), EPS as f64);
        let (mut res, mut out) = (poisoned()?, poisoned()?);
        rms_fused.launch(s, &add_rmsnorm::config(hidden, rows), &dx, &dr, &dw, &mut res, &mut out, hidden, rows)?;
        outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
        refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref.iter().copied()));
        let (mut res, mut out) = (poisoned()?, poisoned()?);
        k_add.launch(s, &config, &dx, &dr, &mut res)?;
        k_rms.launch(s, &config, &res, &dw, &mut out, hidden)?;
        outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
        refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref));
    }
    Ok(Report::new(format!("{rows} rows × hidden 768-8192, fused + unfused"), &outs, &refs, 2e-3))
}
