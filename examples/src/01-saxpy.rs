//! 01 — saxpy: one thread per element, inputs as `&[T]`, the output as `Out<T>`, an explicit
//! fused multiply-add, and launch bounds (`.maxntid 256` / `.minnctapersm 2` in the PTX).

use clusterfuse::prelude::*;

/// `y[i] = a * x[i] + y[i]`.
#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn saxpy(a: f32, x: &[f32], y: Out<f32>) {
    let i = thread::global_index_x();
    if i < y.len() {
        y.set(i, a.fma(x[i], y.get(i)));
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{random, shape, Report};
    let n = shape(gpu, (1 << 20) + 3, 4099);
    let a = random(1)[0];
    let (x, y) = (random(n), random(n));
    let reference: Vec<f64> = x.iter().zip(&y).map(|(&x, &y)| a as f64 * x as f64 + y as f64).collect();
    let dx = gpu.upload(&x)?;
    let mut dy = gpu.upload(&y)?;
    let config = LaunchConfig { grid: (n as u32).div_ceil(256).into(), block: 256.into(), ..LaunchConfig::default() };
    saxpy::load(gpu)?.launch(gpu.stream(), &config, a, &dx, &mut dy)?;
    let out = gpu.download(&dy)?;
    Ok(Report::new(format!("n = {n}"), &out, &reference, 1e-6))
}
