//! 04 — row softmax with warp shuffles: one warp per row, 16-byte vector loads, the row's
//! maximum and sum combined across lanes by `warp::reduce_*`, `exp2` on the fast path.

use clusterfuse::prelude::*;

/// `out[r, c] = exp(x[r, c] − max_r) / Σ_c exp(x[r, c] − max_r)` for `rows × cols`, row-major;
/// `cols` must be a multiple of 4 (16-byte rows).
#[kernel(launch_bounds(max_threads = 256))]
pub fn softmax(x: &[f32], out: Out<f32>, cols: u32) {
    let row = (block::index_x() * (block::size() / 32) + warp::index_in_block()) as usize;
    let vectors = cols as usize / 4;
    if (row + 1) * cols as usize > x.len() {
        return;
    }
    let first = row * vectors;
    let lane = warp::lane() as usize;
    let mut max = f32::NEG_INFINITY;
    let mut v = lane;
    while v < vectors {
        for value in global::load16::<f32, 4>(x, first + v) {
            max = if value > max { value } else { max };
        }
        v += 32;
    }
    let max = warp::reduce_max(max);
    let scale = core::f32::consts::LOG2_E;
    let mut sum = 0.0f32;
    let mut v = lane;
    while v < vectors {
        for value in global::load16::<f32, 4>(x, first + v) {
            sum += math::exp2((value - max) * scale);
        }
        v += 32;
    }
    let inv = 1.0 / warp::reduce_sum(sum);
    let mut v = lane;
    while v < vectors {
        let values = global::load16::<f32, 4>(x, first + v);
        out.store16(first + v, values.map(|value| math::exp2((value - max) * scale) * inv));
        v += 32;
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{poisoned, random, shape, Report};
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
    let rows_per_block = 8u32;
    let config = LaunchConfig {
        grid: (rows as u32).div_ceil(rows_per_block).into(),
        block: (rows_per_block * 32).into(),
        ..LaunchConfig::default()
    };
    softmax::load(gpu)?.launch(gpu.stream(), &config, &dx, &mut out, cols as u32)?;
    let out = gpu.download(&out)?;
    Ok(Report::new(format!("{rows} × {cols}"), &out, &reference, 1e-5))
}
