//! 04 — row softmax with warp shuffles, as the kernel library's
//! [`clusterfuse_kernels::softmax`] writes it (read it there: one warp per row, 16-byte vector
//! loads, the row's maximum and sum combined across lanes by `warp::reduce_*`, `exp2` on the
//! fast path), checked against f64.

use crate::check::{poisoned, random, shape, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse_kernels::softmax;

/// Checks [`softmax`](fn@clusterfuse_kernels::softmax::softmax) against f64 on rows of 1000 values up to ±8.
pub fn run(gpu: &Gpu) -> Result<Report> {
    let (rows, cols) = (shape(gpu, 4099usize, 67), 1000usize);
    let x: Vec<f32> = random(rows * cols).iter().map(|v| v * 8.0).collect();
    let reference: Vec<f64> = x
        .chunks(cols)
        .flat_map(|row| {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let exps: Vec<f64> = row.iter().map(|&v| (v as f64 - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            exps.into_iter().map(move |e| e / sum)
        })
        .collect();
    let dx = gpu.upload(&x)?;
    let mut out = poisoned(gpu, rows * cols)?;
    softmax::launch(&softmax::softmax::load(gpu)?, gpu.stream(), &dx, &mut out, rows, cols)?;
    let out = gpu.download(&out)?;
    Ok(Report::new(format!("{rows} × {cols}"), &out, &reference, 1e-5))
}
