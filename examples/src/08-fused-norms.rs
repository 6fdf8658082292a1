//! 08 — fused kernels, as the kernel library's [`clusterfuse_kernels::norms`] writes them:
//! LayerNorm(x + b) → GELU (BERT's epilogue) and RMSNorm(x + residual) (Llama's, which also
//! writes the new residual), each as stages that `#[fused_kernel]` composes into one kernel
//! (a block a row, or a warp a row for many short rows), and the same stages launched as
//! separate kernels, as a framework would; every one checked against f64 at hidden 256-8192.

use crate::check::{random, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse::f16;
use clusterfuse_kernels::norms::*;

/// Checks every kernel, fused and unfused, block-a-row and warp-a-row, against f64.
pub fn run(gpu: &Gpu) -> Result<Report> {
    let halves = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
    let floats = |v: &[f16]| -> Vec<f32> { v.iter().map(|h| h.to_f32()).collect() };
    let fused = Fused::load(gpu)?;
    let (k_bias, k_ln, k_gelu) = (add_bias::load(gpu)?, layer_norm::load(gpu)?, gelu_kernel::load(gpu)?);
    let (k_add, k_rms) = (add_residual::load(gpu)?, rms_norm::load(gpu)?);
    let (ln_warps, rms_warps) = (layernorm_gelu_warps::load(gpu)?, add_rmsnorm_warps::load(gpu)?);
    let (mut outs, mut refs) = (Vec::new(), Vec::new());
    let rows = 37u32;
    for hidden in [256u32, 768, 1024, 1280, 2048, 4096, 8192] {
        let n = rows as usize * hidden as usize;
        // Rows of x offset by 0, 8, 16 and 24: LayerNorm's variance of a mean up to 40σ from 0.
        let offset = |(i, v): (usize, f32)| v + (i / hidden as usize % 4) as f32 * 8.0;
        let (x, r) = (halves(random(n).into_iter().enumerate().map(offset).collect()), halves(random(n)));
        let (b, gamma, beta, w) = (halves(random(hidden as usize)), halves(random(hidden as usize)), halves(random(hidden as usize)), halves(random(hidden as usize)));
        let (dx, dr, db, dg, dbeta, dw) = (gpu.upload(&x)?, gpu.upload(&r)?, gpu.upload(&b)?, gpu.upload(&gamma)?, gpu.upload(&beta)?, gpu.upload(&w)?);
        let poisoned = || gpu.upload(&vec![f16::NAN; n]);
        let s = gpu.stream();

        let ln_ref = reference::layernorm_gelu(&floats(&x), &floats(&b), &floats(&gamma), &floats(&beta), EPS as f64);
        let mut out = poisoned()?;
        fused.layernorm_gelu(s, false, &dx, &db, &dg, &dbeta, &mut out, hidden, rows)?;
        outs.extend(floats(&gpu.download(&out)?));
        refs.extend(&ln_ref);
        // The warp-a-row kernel too, wherever it can run (here a partial last block).
        if hidden <= PER_WARP {
            let mut out = poisoned()?;
            ln_warps.launch(s, &layernorm_gelu_warps::config(rows), &dx, &db, &dg, &dbeta, &mut out, hidden, rows)?;
            outs.extend(floats(&gpu.download(&out)?));
            refs.extend(&ln_ref);
        }
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
        fused.add_rmsnorm(s, false, &dx, &dr, &dw, &mut res, &mut out, hidden, rows)?;
        outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
        refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref.iter().copied()));
        if hidden <= PER_WARP {
            let (mut res, mut out) = (poisoned()?, poisoned()?);
            rms_warps.launch(s, &add_rmsnorm_warps::config(rows), &dx, &dr, &dw, &mut res, &mut out, hidden, rows)?;
            outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
            refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref.iter().copied()));
        }
        let (mut res, mut out) = (poisoned()?, poisoned()?);
        k_add.launch(s, &config, &dx, &dr, &mut res)?;
        k_rms.launch(s, &config, &res, &dw, &mut out, hidden)?;
        outs.extend(floats(&gpu.download(&res)?).into_iter().chain(floats(&gpu.download(&out)?)));
        refs.extend(h.iter().map(|&v| v as f64).chain(rms_ref));
    }
    Ok(Report::new(format!("{rows} rows × hidden 256-8192, all kernels"), &outs, &refs, 2e-3))
}
