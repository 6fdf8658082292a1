//! 05 — thread-block clusters: the blocks of a cluster all-reduce a shared-memory vector
//! through distributed shared memory (`cluster::reduce`) and all-gather their tiles
//! (`cluster::gather`, and `cluster::gather_bulk`, whose tiles travel as `cp.async.bulk`
//! copies completing on an mbarrier). The cluster size is chosen at launch, from 1 to 16
//! (above 8 the host opts the kernel into non-portable cluster sizes by itself).

use clusterfuse::mbarrier::Mbarrier;
use clusterfuse::ops::Max;
use clusterfuse::prelude::*;

/// Block `b` loads `x[b*n .. (b+1)*n]` into shared memory, the cluster reduces it element-wise
/// (`op` 0: sum, 1: max), and every block writes the result to `out[b*n ..]`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn cluster_reduce(x: &[f32], out: Out<f32>, n: u32, op: u32) {
    let n = n as usize;
    let data = shared::dynamic().take::<f32>(n);
    let base = block::index_x() as usize * n;
    let mut i = thread::index_x() as usize;
    while i < n {
        data.store(i, x[base + i]);
        i += block::size() as usize;
    }
    if op == 0 {
        cluster::reduce(data, Sum);
    } else {
        cluster::reduce(data, Max);
    }
    let mut i = thread::index_x() as usize;
    while i < n {
        out.set(base + i, data.load(i));
        i += block::size() as usize;
    }
}

/// Block `b` of cluster `c` contributes `x[b*m ..]`; every block writes the cluster's
/// gathered tiles (`cluster::size() * m` values) to `out[b * size * m ..]`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn cluster_gather(x: &[f32], out: Out<f32>, m: u32) {
    let m = m as usize;
    let blocks = cluster::size() as usize;
    let mut smem = shared::dynamic();
    let tile = smem.take::<f32>(m);
    let all = smem.take::<f32>(blocks * m);
    let b = block::index_x() as usize;
    let mut i = thread::index_x() as usize;
    while i < m {
        tile.store(i, x[b * m + i]);
        i += block::size() as usize;
    }
    cluster::gather(tile, all);
    let mut i = thread::index_x() as usize;
    while i < blocks * m {
        out.set(b * blocks * m + i, all.load(i));
        i += block::size() as usize;
    }
}

/// `out[b]` = the sum over every thread of block `b`'s cluster of `x[its global index]`
/// (`cluster::reduce_value`: block, then cluster), computed twice in a row to exercise reuse.
#[kernel(launch_bounds(max_threads = 256))]
pub fn cluster_sum_values(x: &[f32], out: Out<f32>) {
    let scratch = shared!([f32; 48]);
    let value = x[thread::global_index_x()];
    let once = cluster::reduce_value(value, Sum, scratch);
    let twice = cluster::reduce_value(value, Sum, scratch);
    if thread::index_x() == 0 {
        out.set(block::index_x() as usize, if once == twice { once } else { f32::NAN });
    }
}

/// As [`fn@cluster_gather`], through bulk copies (`m` a multiple of 4), twice in a row so that
/// the mbarrier's second phase and the reuse of `tile` are exercised.
#[kernel(launch_bounds(max_threads = 256))]
pub fn cluster_gather_bulk(x: &[f32], out: Out<f32>, m: u32) {
    let m = m as usize;
    let blocks = cluster::size() as usize;
    let mut smem = shared::dynamic();
    let (tile, all, slot) = (smem.take::<f32>(m), smem.take::<f32>(blocks * m), smem.take::<u64>(1));
    // SAFETY: its own shared word; `gather_bulk` opens with a cluster barrier.
    let mut barrier = unsafe { Mbarrier::new(slot, 1) };
    let b = block::index_x() as usize;
    for round in 0..2 {
        for i in block::stride_loop(0..m) {
            tile.store(i, x[b * m + i] + round as f32);
        }
        cluster::gather_bulk(tile, all, &mut barrier);
    }
    for i in block::stride_loop(0..blocks * m) {
        out.set(b * blocks * m + i, all.load(i) - 1.0);
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{poisoned, random, Report};
    let (reduce, gather, gather_bulk) = (cluster_reduce::load(gpu)?, cluster_gather::load(gpu)?, cluster_gather_bulk::load(gpu)?);
    let sum_values = cluster_sum_values::load(gpu)?;
    let (mut outs, mut refs) = (Vec::new(), Vec::new());
    let clusters = 3u32;
    for size in [1u32, 2, 3, 4, 8, 16] {
        let blocks = clusters * size;
        let threads = 256usize;
        let x = random(blocks as usize * threads);
        let dx = gpu.upload(&x)?;
        let mut out = poisoned(gpu, blocks as usize)?;
        let config = LaunchConfig { grid: blocks.into(), block: (threads as u32).into(), cluster: Some(size.into()), ..LaunchConfig::default() };
        sum_values.launch(gpu.stream(), &config, &dx, &mut out)?;
        outs.extend(gpu.download(&out)?);
        let per_cluster = size as usize * threads;
        refs.extend((0..blocks as usize).map(|b| x[b / size as usize * per_cluster..][..per_cluster].iter().map(|&v| v as f64).sum::<f64>()));

        for n in [1usize, 1000, 4103] {
            let x = random(blocks as usize * n);
            for op in [0u32, 1] {
                let dx = gpu.upload(&x)?;
                let mut out = poisoned(gpu, x.len())?;
                let config = LaunchConfig {
                    grid: blocks.into(),
                    block: 256.into(),
                    cluster: Some(size.into()),
                    dynamic_smem_bytes: (n * 4) as u32,
                    ..LaunchConfig::default()
                };
                reduce.launch(gpu.stream(), &config, &dx, &mut out, n as u32, op)?;
                outs.extend(gpu.download(&out)?);
                for b in 0..blocks as usize {
                    let first = b / size as usize * size as usize;
                    for i in 0..n {
                        let values = (first..first + size as usize).map(|p| x[p * n + i] as f64);
                        refs.push(if op == 0 { values.sum() } else { values.fold(f64::NEG_INFINITY, f64::max) });
                    }
                }
            }
            let m = n.min(1024);
            let x = random(blocks as usize * m);
            let dx = gpu.upload(&x)?;
            let mut out = poisoned(gpu, blocks as usize * size as usize * m)?;
            let config = LaunchConfig {
                grid: blocks.into(),
                block: 256.into(),
                cluster: Some(size.into()),
                dynamic_smem_bytes: ((size as usize + 1) * m * 4 + 16) as u32,
                ..LaunchConfig::default()
            };
            gather.launch(gpu.stream(), &config, &dx, &mut out, m as u32)?;
            outs.extend(gpu.download(&out)?);
            for b in 0..blocks as usize {
                let first = b / size as usize * size as usize;
                refs.extend(x[first * m..(first + size as usize) * m].iter().map(|&v| v as f64));
            }

            let m = n.min(1024).next_multiple_of(4);
            let x = random(blocks as usize * m);
            let dx = gpu.upload(&x)?;
            let mut out = poisoned(gpu, blocks as usize * size as usize * m)?;
            let config = LaunchConfig { dynamic_smem_bytes: ((size as usize + 1) * m * 4 + 48) as u32, ..config };
            gather_bulk.launch(gpu.stream(), &config, &dx, &mut out, m as u32)?;
            outs.extend(gpu.download(&out)?);
            for b in 0..blocks as usize {
                let first = b / size as usize * size as usize;
                refs.extend(x[first * m..(first + size as usize) * m].iter().map(|&v| v as f64));
            }
        }
    }
    Ok(Report::new("clusters 1,2,3,4,8,16 × n 1,1000,4103 × sum,max,gather,bulk gather; value sums".into(), &outs, &refs, 1e-6))
}
