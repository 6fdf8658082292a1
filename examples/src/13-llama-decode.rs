//! 13 — a whole decode step of a Llama-3.2-1B-shaped model (16 layers, hidden 2048, 32 query
//! and 8 key/value heads of 64, MLP 8192, vocabulary 128256) as 82 fused launches chained by
//! programmatic dependent launch: the kernel library's [`clusterfuse_kernels::llama::chain`]
//! (its docs describe the kernels), called as a user would, and checked against the library's
//! f64 reference of the step.

use crate::check::{with_rng, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse_kernels::llama::chain::host::{step, Buffers, Kernels};
use clusterfuse_kernels::llama::{Model, Shape, TOLERANCE};
use rand::Rng;

/// The tiny model at positions 0, 1 and near the end of the cache, clusters of 2 and 4,
/// launched in stream order and programmatically; each step run twice for bitwise-equal
/// outputs (a second run's difference shows as a failure of the whole check).
pub fn run(gpu: &Gpu) -> Result<Report> {
    let kernels = Kernels::load(gpu)?;
    let shape = Shape::tiny();
    let mut model = Model::random(shape, with_rng(|rng| rng.random()), 0, 0)?;
    let (mut outs, mut refs, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for (n, (position, cluster)) in [(0, 2), (1, 4), (shape.max_len - 3, 4), (37, 16)].into_iter().enumerate() {
        model.set_position(position);
        model.token = (7 + 331 * n as u32) % shape.vocab as u32;
        let reference = model.reference().all();
        let mut b = Buffers::upload(gpu, &model)?;
        let programmatic = n % 2 == 1;
        step(&kernels, gpu.stream(), &mut b, cluster, programmatic)?;
        let first = b.results(gpu, position)?;
        b.poison(gpu)?;
        step(&kernels, gpu.stream(), &mut b, cluster, programmatic)?;
        let second = b.results(gpu, position)?;
        let same = first.iter().zip(&second).all(|(a, b)| a.to_bits() == b.to_bits());
        // A run that differs from the first counts as unwritten outputs.
        outs.extend(if same { first } else { vec![f32::NAN; second.len()] });
        refs.extend(reference);
        runs.push(format!("pos {position}, cluster {cluster}{}", if programmatic { ", PDL" } else { "" }));
    }
    Ok(Report::new(format!("{} layers, hidden {}, vocab {}: {}", shape.layers, shape.hidden, shape.vocab, runs.join("; ")), &outs, &refs, TOLERANCE))
}
