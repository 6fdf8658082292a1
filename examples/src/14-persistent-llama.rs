//! 14 — example 13's decode step as **one persistent launch**: the kernel library's
//! [`clusterfuse_kernels::llama::persistent`] (its docs describe the schedule and the
//! handoffs), checked against the same f64 reference, each step launched twice for
//! bitwise-equal outputs.

use crate::check::{with_rng, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse_kernels::llama::persistent::host::{config, step, Buffers};
use clusterfuse_kernels::llama::persistent::llama_step;
use clusterfuse_kernels::llama::{Model, Shape, TOLERANCE};
use rand::Rng;

/// The tiny model at positions 0, 1, 37 and near the end of the cache, clusters of 2, 4,
/// 2 and 1, against example 13's f64 reference; each step run twice (the second launch
/// finding none of its tiles published) for bitwise-equal outputs.
pub fn run(gpu: &Gpu) -> Result<Report> {
    let kernel = llama_step::load(gpu)?;
    let shape = Shape::tiny();
    let mut model = Model::random(shape, with_rng(|rng| rng.random()), 0, 0)?;
    let (mut outs, mut refs, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for (n, (position, cluster)) in [(0, 2), (1, 4), (37, 2), (shape.max_len - 3, 1)].into_iter().enumerate() {
        model.set_position(position);
        model.token = (11 + 331 * n as u32) % shape.vocab as u32;
        let reference = model.reference().all();
        let mut b = Buffers::upload(gpu, &model)?;
        let config = config(&kernel, gpu, shape, cluster)?;
        step(&kernel, gpu.stream(), &config, &mut b)?;
        let first = b.results(gpu, position)?;
        b.poison(gpu)?;
        step(&kernel, gpu.stream(), &config, &mut b)?;
        let second = b.results(gpu, position)?;
        let same = first.iter().zip(&second).all(|(a, b)| a.to_bits() == b.to_bits());
        outs.extend(if same { first } else { vec![f32::NAN; second.len()] });
        refs.extend(reference);
        runs.push(format!("pos {position}, {} blocks in clusters of {cluster}", config.grid.x));
    }
    Ok(Report::new(format!("{} layers, hidden {}, one launch: {}", shape.layers, shape.hidden, runs.join("; ")), &outs, &refs, TOLERANCE))
}
