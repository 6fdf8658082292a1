//! 03 — more than 48 KB of dynamic shared memory: each block stages a tile plus its halo in
//! shared memory sized at launch (`dynamic_smem_bytes`; the host opts the kernel in
//! automatically above 48 KB), then applies a 1-D stencil from shared memory.

use clusterfuse::prelude::*;

/// Stencil half-width.
pub const RADIUS: usize = 8;

/// `out[i] = Σ_k weights[k] · x[i + k − RADIUS]` (zero outside `x`), each block covering
/// `tile` consecutive outputs.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn stencil(x: &[f32], weights: &[f32], out: Out<f32>, tile: u32) {
    let tile = tile as usize;
    let staged = shared::dynamic().take::<f32>(tile + 2 * RADIUS);
    let first = block::index_x() as usize * tile;
    let threads = block::size() as usize;
    let mut j = thread::index_x() as usize;
    while j < staged.len() {
        let i = (first + j).wrapping_sub(RADIUS);
        staged.store(j, if i < x.len() { x[i] } else { 0.0 });
        j += threads;
    }
    block::sync();
    let mut j = thread::index_x() as usize;
    while j < tile && first + j < out.len() {
        let mut acc = 0.0f32;
        for (k, &w) in weights.iter().enumerate() {
            acc = w.fma(staged.load(j + k), acc);
        }
        out.set(first + j, acc);
        j += threads;
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{poisoned, random, shape, Report};
    let (n, tile) = (shape(gpu, (1usize << 22) + 5, 40_005), 16384u32);
    let (x, weights) = (random(n), random(2 * RADIUS + 1));
    let reference: Vec<f64> = (0..n)
        .map(|i| {
            weights.iter().enumerate().map(|(k, &w)| {
                let src = (i + k).wrapping_sub(RADIUS);
                if src < n { w as f64 * x[src] as f64 } else { 0.0 }
            }).sum()
        })
        .collect();
    let (dx, dw) = (gpu.upload(&x)?, gpu.upload(&weights)?);
    let mut out = poisoned(gpu, n)?;
    let smem = (tile as usize + 2 * RADIUS) * 4;
    let config = LaunchConfig {
        grid: (n as u32).div_ceil(tile).into(),
        block: 1024.into(),
        dynamic_smem_bytes: smem as u32,
        ..LaunchConfig::default()
    };
    stencil::load(gpu)?.launch(gpu.stream(), &config, &dx, &dw, &mut out, tile)?;
    let out = gpu.download(&out)?;
    Ok(Report::new(format!("n = {n}, tile {tile}, {smem} B dynamic smem"), &out, &reference, 1e-5))
}
