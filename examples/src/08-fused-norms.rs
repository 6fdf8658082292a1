//! 08 — fused kernels: LayerNorm(x + b) → GELU (BERT's epilogue) and RMSNorm(x + residual)
//! (Llama's, which also writes the new residual), each written as stages that
//! `#[fused_kernel]` composes into one kernel, and the same stages launched as separate
//! kernels, as a framework would. One block of 128 threads per row; each thread keeps up to
//! eight 16-byte vectors of the row in registers, so x is read from global memory once.

use clusterfuse::prelude::*;

/// Threads per row.
pub const BLOCK: u32 = 128;
/// 16-byte vectors (8 halves) each thread keeps in registers.
pub const VECTORS: usize = 8;
/// The largest hidden size: 128 threads × 8 vectors × 8 halves.
pub const MAX_HIDDEN: usize = BLOCK as usize * VECTORS * 8;
/// ε of both norms.
pub const EPS: f32 = 1e-5;

/// One thread's share of a row in f32: `row[j]` holds elements `8 (t + 128 j) ..+ 8` of
/// thread `t`; vectors past the row's end are zero.
pub type Row = [[f32; 8]; VECTORS];

/// `body` once for each vector `j` in `0..VECTORS` that lies inside the row, unrolled so that
/// the row's arrays are indexed by constants and stay in registers.
macro_rules! each_vector {
    ($hidden:expr, |$j:ident| $body:block) => {{
        const _: () = assert!(VECTORS == 8, "each_vector! unrolls eight vectors");
        each_vector!(@ $hidden, $j, $body, 0 1 2 3 4 5 6 7)
    }};
    (@ $hidden:expr, $j:ident, $body:block, $($n:literal)*) => {
        { $( if inside($n, $hidden) { let $j: usize = $n; $body } )* }
    };
}

/// Whether vector `j` of this thread lies inside a row of `hidden` elements.
#[inline(always)]
fn inside(j: usize, hidden: u32) -> bool {
    (thread::index_x() as usize + j * BLOCK as usize) < hidden as usize / 8
}

/// Index, in 16-byte vectors, of this thread's vector `j` of this block's row.
#[inline(always)]
fn vector(j: usize, hidden: u32) -> usize {
    block::index_x() as usize * (hidden as usize / 8) + thread::index_x() as usize + j * BLOCK as usize
}

/// Vector `j` of a per-column parameter (bias, γ, β, weight), in f32.
#[inline(always)]
fn column(param: &[f16], j: usize) -> [f32; 8] {
    let halves = global::load16::<f16, 8>(param, thread::index_x() as usize + j * BLOCK as usize);
    let mut values = [0.0; 8];
    for k in 0..8 {
        values[k] = halves[k].to_f32();
    }
    values
}

/// This block's row of `x` as 16-byte vectors of f16, all loads issued before any use.
#[inline(always)]
fn load_halves(x: &[f16], hidden: u32) -> [[f16; 8]; VECTORS] {
    let mut row = [[f16::from_f32(0.0); 8]; VECTORS];
    each_vector!(hidden, |j| {
        row[j] = global::load16::<f16, 8>(x, vector(j, hidden));
    });
    row
}

/// This block's row of `x` (one read of global memory), in f32.
#[inline(always)]
pub fn load_row(x: &[f16], hidden: u32) -> Row {
    let halves = load_halves(x, hidden);
    let mut row = [[0.0; 8]; VECTORS];
    each_vector!(hidden, |j| {
        for k in 0..8 {
            row[j][k] = halves[j][k].to_f32();
        }
    });
    row
}

/// Writes this block's row to `out` in f16, 16 bytes at a time.
#[inline(always)]
pub fn store_row(row: Row, out: &Out<f16>, hidden: u32) {
    each_vector!(hidden, |j| {
        let mut halves = [f16::from_f32(0.0); 8];
        for k in 0..8 {
            halves[k] = f16::from_f32(row[j][k]);
        }
        out.store16(vector(j, hidden), halves);
    });
}

/// Σ over this thread's elements of `f(value)`.
#[inline(always)]
fn thread_sum(row: &Row, f: impl Fn(f32) -> f32) -> f32 {
    let mut sum = 0.0;
    for v in row {
        for &value in v {
            sum += f(value);
        }
    }
    sum
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

/// `out = GELU(LayerNorm(x + b) · γ + β)` for `rows × hidden` (row-major, hidden a multiple of
/// 8, at most 8192).
#[fused_kernel(grid = rows, block = 128)]
pub mod layernorm_gelu {
    use super::*;

    /// y = x + b, kept in registers.
    #[stage(thread)]
    pub fn add_bias(x: Global<&[f16]>, b: Global<&[f16]>, hidden: u32) -> Registers<Row> {
        let mut y = load_row(x, hidden);
        each_vector!(hidden, |j| {
            let b = column(b, j);
            for k in 0..8 {
                y[j][k] += b[k];
            }
        });
        y
    }

    /// (y − μ) / √(σ² + ε) · γ + β, the mean and variance reduced over the block.
    #[stage(block)]
    pub fn layer_norm(y: Registers<Row>, gamma: Global<&[f16]>, beta: Global<&[f16]>, hidden: u32) -> Registers<Row> {
        let scratch = shared!([f32; 32]);
        let n = hidden as f32;
        let mean = block::reduce_sum(thread_sum(&y, |v| v), scratch) / n;
        let mut squares = 0.0f32;
        each_vector!(hidden, |j| {
            for &value in &y[j] {
                squares = (value - mean).fma(value - mean, squares);
            }
        });
        let rstd = math::rsqrt(block::reduce_sum(squares, scratch) / n + EPS);
        let mut z = [[0.0; 8]; VECTORS];
        each_vector!(hidden, |j| {
            let (g, b) = (column(gamma, j), column(beta, j));
            for k in 0..8 {
                z[j][k] = ((y[j][k] - mean) * rstd).fma(g[k], b[k]);
            }
        });
        z
    }

    /// out = GELU(z), written as f16.
    #[stage(thread)]
    pub fn gelu_out(mut z: Registers<Row>, out: Global<Out<f16>>, hidden: u32) {
        each_vector!(hidden, |j| {
            for value in &mut z[j] {
                *value = gelu(*value);
            }
        });
        store_row(z, out, hidden);
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    pub fn kernel(x: &[f16], b: &[f16], gamma: &[f16], beta: &[f16], out: Out<f16>, hidden: u32, rows: u32) {
        let y = add_bias(x, b, hidden);
        let z = layer_norm(y, gamma, beta, hidden);
        gelu_out(z, out, hidden);
    }
}

/// `h = x + r` (rounded to f16, written to `residual_out`), then
/// `out = h / √(mean(h²) + ε) · w`, for `rows × hidden`.
#[fused_kernel(grid = rows, block = 128)]
pub mod add_rmsnorm {
    use super::*;

    /// h = f16(x + r): the next layer's residual, written out and kept in registers.
    #[stage(thread)]
    pub fn add_residual(x: Global<&[f16]>, r: Global<&[f16]>, residual_out: Global<Out<f16>>, hidden: u32) -> Registers<Row> {
        let (x, r) = (load_halves(x, hidden), load_halves(r, hidden));
        let mut h = [[0.0; 8]; VECTORS];
        each_vector!(hidden, |j| {
            let mut sum = [f16::from_f32(0.0); 8];
            for k in 0..8 {
                sum[k] = f16::from_f32(x[j][k].to_f32() + r[j][k].to_f32());
                h[j][k] = sum[k].to_f32();
            }
            residual_out.store16(vector(j, hidden), sum);
        });
        h
    }

    /// out = h · rsqrt(mean(h²) + ε) · w.
    #[stage(block)]
    pub fn rms_norm(h: Registers<Row>, weight: Global<&[f16]>, out: Global<Out<f16>>, hidden: u32) {
        let scratch = shared!([f32; 32]);
        let rstd = math::rsqrt(block::reduce_sum(thread_sum(&h, |v| v * v), scratch) / hidden as f32 + EPS);
        let mut y = [[0.0; 8]; VECTORS];
        each_vector!(hidden, |j| {
            let w = column(weight, j);
            for k in 0..8 {
                y[j][k] = h[j][k] * rstd * w[k];
            }
        });
        store_row(y, out, hidden);
    }

    /// Launch arguments; the body is the dataflow the macro checks.
    #[allow(clippy::too_many_arguments)]
    pub fn kernel(x: &[f16], residual: &[f16], weight: &[f16], residual_out: Out<f16>, out: Out<f16>, hidden: u32, rows: u32) {
        let h = add_residual(x, residual, residual_out, hidden);
        rms_norm(h, weight, out, hidden);
    }
}

// The same stages as separate kernels, one per stage, f16 intermediates in global memory.

/// Unfused 1/3: `y = x + b`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn add_bias(x: &[f16], b: &[f16], y: Out<f16>, hidden: u32) {
    store_row(layernorm_gelu::add_bias(x, b, hidden), &y, hidden);
}

/// Unfused 2/3: `z = LayerNorm(y) · γ + β`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn layer_norm(y: &[f16], gamma: &[f16], beta: &[f16], z: Out<f16>, hidden: u32) {
    store_row(layernorm_gelu::layer_norm(load_row(y, hidden), gamma, beta, hidden), &z, hidden);
}

/// Unfused 3/3: `out = GELU(z)`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn gelu_kernel(z: &[f16], out: Out<f16>, hidden: u32) {
    layernorm_gelu::gelu_out(load_row(z, hidden), &out, hidden);
}

/// Unfused 1/2: `residual_out = x + r`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn add_residual(x: &[f16], r: &[f16], residual_out: Out<f16>, hidden: u32) {
    add_rmsnorm::add_residual(x, r, &residual_out, hidden);
}

/// Unfused 2/2: `out = RMSNorm(h) · w`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn rms_norm(h: &[f16], weight: &[f16], out: Out<f16>, hidden: u32) {
    add_rmsnorm::rms_norm(load_row(h, hidden), weight, &out, hidden);
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
    let config = |rows: u32| LaunchConfig { grid: rows.into(), block: BLOCK.into(), ..LaunchConfig::default() };
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
        ln_fused.launch(s, &layernorm_gelu::config(rows), &dx, &db, &dg, &dbeta, &mut out, hidden, rows)?;
        outs.extend(floats(&gpu.download(&out)?));
        refs.extend(&ln_ref);
        let (mut y, mut z, mut out) = (poisoned()?, poisoned()?, poisoned()?);
        k_bias.launch(s, &config(rows), &dx, &db, &mut y, hidden)?;
        k_ln.launch(s, &config(rows), &y, &dg, &dbeta, &mut z, hidden)?;
        k_gelu.launch(s, &config(rows), &z, &mut out, hidden)?;
        outs.extend(floats(&gpu.download(&out)?));
        refs.extend(&ln_ref);

        let h: Vec<f32> = x.iter().zip(&r).map(|(a, b)| f16::from_f32(a.to_f32() + b.to_f32()).to_f32()).collect();
        let rms_ref = reference::rmsnorm(&h, &floats(&w), EPS as f64);
        let (mut res, mut out) = (poisoned()?, poisoned()?);
        rms_fused.launch(s, &add_rmsnorm::config(rows), &dx, &dr, &dw, &mut res, &mut out, hidden, rows)?;
        outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
        refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref.iter().copied()));
        let (mut res, mut out) = (poisoned()?, poisoned()?);
        k_add.launch(s, &config(rows), &dx, &dr, &mut res, hidden)?;
        k_rms.launch(s, &config(rows), &res, &dw, &mut out, hidden)?;
        outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
        refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref));
    }
    Ok(Report::new(format!("{rows} rows × hidden 768-8192, fused + unfused"), &outs, &refs, 2e-3))
}
