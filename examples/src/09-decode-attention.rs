//! 09 — the decode step of a Llama-2-7B attention block (RMSNorm → QKV → RoPE → append K/V →
//! attention over the cache → output projection + residual), f16 or bf16, batch 1-8: the kernel
//! library's [`clusterfuse_kernels::decode`] (its docs describe the kernels), called as a user
//! would — fused (two launches, a cluster per head), spread (three), the five separate kernels
//! and the persistent block (one launch) — and checked against the library's f64 reference.

use crate::check::{with_rng, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse::{bf16, f16};
use clusterfuse_kernels::decode::host::{fused, persistent_config, spread, Buffers, DecodeType, Separate, Step};
use rand::Rng;

/// Checks the fused variant of `T` at `batches` (fresh steps, each sequence at its own
/// position, clusters alternating over `clusters`, the output projection launched
/// programmatically in runs 1, 2, 5, 6, ...) against the f64 reference, at batch 1 the
/// spread variant too (on the same step, cluster and launch mode), and with `separate`,
/// the five kernels too.
fn check<T: DecodeType>(gpu: &Gpu, batches: &[usize], separate: bool) -> Result<Report> {
    let kernels = T::load(gpu)?;
    let (hidden, max_len, clusters) = crate::check::shape(gpu, (4096, 1040, [4, 8]), (256, 320, [2, 4]));
    let (mut outs, mut refs) = (Vec::new(), Vec::new());
    let mut runs = Vec::new();
    for (i, &batch) in batches.iter().enumerate() {
        let positions: Vec<usize> = (0..batch).map(|s| [0, 1, 77, max_len - 21][(i + s) % 4]).collect();
        let step = Step::<T>::random(with_rng(|rng| rng.random()), hidden, max_len, &positions);
        let reference = step.reference().all();
        let cluster = clusters[i % 2];
        let mut b = Buffers::upload(gpu, &step)?;
        let programmatic = matches!(i % 4, 1 | 2);
        fused(&kernels, gpu.stream(), &mut b, cluster, programmatic)?;
        outs.extend(b.results(gpu, &step)?);
        refs.extend(reference.iter().copied());
        runs.push(format!("batch {batch} at {positions:?}, cluster {cluster}{}", if programmatic { ", PDL" } else { "" }));
        if batch == 1 {
            let mut b = Buffers::upload(gpu, &step)?;
            spread(&kernels, gpu.stream(), &mut b, cluster, programmatic)?;
            outs.extend(b.results(gpu, &step)?);
            refs.extend(reference.iter().copied());
            // The persistent block, launched twice: bitwise-equal outputs, or a failure.
            let mut b = Buffers::upload(gpu, &step)?;
            let config = persistent_config::<T>(&kernels, gpu, hidden, cluster)?;
            T::persistent(&kernels, gpu.stream(), &mut b, &config)?;
            let first = b.results(gpu, &step)?;
            b.poison(gpu)?;
            T::persistent(&kernels, gpu.stream(), &mut b, &config)?;
            let second = b.results(gpu, &step)?;
            let same = first.iter().zip(&second).all(|(a, b)| a.to_bits() == b.to_bits());
            outs.extend(if same { first } else { vec![f32::NAN; second.len()] });
            refs.extend(reference.iter().copied());
        }
        if separate && batch == 1 {
            let step = Step::<f16>::random(with_rng(|rng| rng.random()), hidden, max_len, &positions);
            let mut b = Buffers::upload(gpu, &step)?;
            Separate::load(gpu, hidden)?.launch(gpu.stream(), &mut b, cluster)?;
            outs.extend(b.results(gpu, &step)?);
            refs.extend(step.reference().all());
        }
    }
    Ok(Report::new(format!("{}, hidden {hidden}: {}", T::NAME, runs.join("; ")), &outs, &refs, T::TOLERANCE))
}

/// Fused, spread and separate, f16, batch 1 at positions 0, 1, 77 and near the end of the
/// cache.
pub fn run(gpu: &Gpu) -> Result<Report> {
    check::<f16>(gpu, &[1, 1, 1, 1], true)
}

/// Fused, bf16, batch 1 and 3; spread, bf16, batch 1.
pub fn run_bf16(gpu: &Gpu) -> Result<Report> {
    check::<bf16>(gpu, &[1, 3], false)
}

/// Fused, f16, batches 2, 3 and 8, each sequence at its own position.
pub fn run_batch(gpu: &Gpu) -> Result<Report> {
    check::<f16>(gpu, &[2, 3, 8], false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clusterfuse_kernels::decode::host::persistent_phases;
    use clusterfuse_kernels::decode::PHASES;

    /// The spread variant at Llama-2-7B's hidden 4096 on the emulator (a short cache), so
    /// that spread 1/3's warps run all four items of a row pair, not the one of the
    /// emulator's usual hidden 256.
    #[test]
    fn spread_at_hidden_4096_matches_the_reference() {
        let gpu = Gpu::emulator();
        let kernels = <f16 as DecodeType>::load(&gpu).unwrap();
        let step = Step::<f16>::random(with_rng(|rng| rng.random()), 4096, 24, &[21]);
        let mut b = Buffers::upload(&gpu, &step).unwrap();
        spread(&kernels, gpu.stream(), &mut b, 4, true).unwrap();
        let report = Report::new("spread, hidden 4096".into(), &b.results(&gpu, &step).unwrap(), &step.reference().all(), f16::TOLERANCE);
        assert!(report.passed(), "{report:?}");
    }

    /// The persistent block's timeline: every block stamps its start and end, blocks of a
    /// head's cluster their heads, blocks with an output projection item its input, in order.
    #[test]
    fn the_persistent_timeline_stamps_every_block_in_order() {
        let gpu = Gpu::emulator();
        let kernels = <f16 as DecodeType>::load(&gpu).unwrap();
        let step = Step::<f16>::random(3, 256, 40, &[17]);
        let mut b = Buffers::upload(&gpu, &step).unwrap();
        let config = persistent_config::<f16>(&kernels, &gpu, 256, 2).unwrap();
        b.record_timeline(&gpu, config.grid.x).unwrap();
        f16::persistent(&kernels, gpu.stream(), &mut b, &config).unwrap();
        let timeline = gpu.download(&b.timeline).unwrap();
        let (mut heads, mut items) = (0, 0);
        for stamps in timeline.chunks(PHASES) {
            let [start, head, ready, end] = [stamps[0], stamps[1], stamps[2], stamps[3]];
            assert!(start > 0 && end >= start, "{stamps:?}");
            for t in [head, ready].into_iter().filter(|&t| t > 0) {
                assert!(start <= t && t <= end, "{stamps:?}");
            }
            assert!(head == 0 || ready == 0 || head <= ready, "{stamps:?}");
            (heads, items) = (heads + usize::from(head > 0), items + usize::from(ready > 0));
        }
        // Hidden 256: 2 heads on clusters of 2, 8 items of 32 rows.
        assert_eq!((heads, items), (4, 8.min(config.grid.x as usize)), "{timeline:?}");
        let [heads_done, all_ready, last_end, _] = persistent_phases(&timeline);
        assert!(heads_done <= all_ready && all_ready <= last_end, "{heads_done} {all_ready} {last_end}");
    }
}
