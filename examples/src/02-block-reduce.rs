//! 02 — block reduction through shared memory: a grid-stride loop, a warp-shuffle reduction,
//! and the warps' partials combined through a `shared!` array (`block::reduce_sum`).

use clusterfuse::prelude::*;

/// `partials[b]` = the sum of the elements block `b` visits in a grid-stride loop.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn block_sum(x: &[f32], partials: Out<f32>) {
    let scratch = shared!([f32; 32]);
    let mut sum = 0.0f32;
    for i in grid::stride_loop_x(x.len()) {
        sum += x[i];
    }
    let total = block::reduce_sum(sum, scratch);
    if thread::index_x() == 0 {
        partials.set(block::index_x() as usize, total);
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{poisoned, random, shape, Report};
    let (n, blocks, threads) = shape(gpu, ((1usize << 22) + 17, 264u32, 512u32), (100_003, 5, 512));
    let x = random(n);
    let stride = (blocks * threads) as usize;
    // Block b's threads visit i ≡ b*threads + t (mod stride), t < threads.
    let reference: Vec<f64> = (0..blocks as usize)
        .map(|b| {
            let first = b * threads as usize;
            (0..threads as usize).flat_map(|t| (first + t..n).step_by(stride)).map(|i| x[i] as f64).sum()
        })
        .collect();
    let dx = gpu.upload(&x)?;
    let mut partials = poisoned(gpu, blocks as usize)?;
    let config = LaunchConfig { grid: blocks.into(), block: threads.into(), ..LaunchConfig::default() };
    block_sum::load(gpu)?.launch(gpu.stream(), &config, &dx, &mut partials)?;
    let out = gpu.download(&partials)?;
    Ok(Report::new(format!("n = {n}, {blocks} blocks of {threads}"), &out, &reference, 1e-5))
}
