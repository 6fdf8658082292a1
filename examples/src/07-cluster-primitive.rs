//! 07 — a user-written cluster collective: a cluster-wide argmax declared with
//! `#[cluster_primitive]` and built only from public device APIs (`ops::rank_key`, which makes
//! a value and its index one ordered `u64`, the warp maximum of such keys, a block barrier,
//! DSMEM stores through `in_block`, cluster barriers). The macro gives it a static
//! shared scratch and publishes `argmax::FACTS`; the kernel calls it with the scope token.

use clusterfuse::cluster::Cluster;
use clusterfuse::ops::{rank_key, rank_unkey};
use clusterfuse::prelude::*;

/// The cluster's largest value over every block's `data`, and its index in the cluster's
/// concatenation (block `r`'s `data[i]` is `r * data.len() + i`; the lowest index on ties),
/// in every thread. The block size must be a multiple of 32; NaNs are not supported.
///
/// The block announces it has started (`cluster::arrive`) and each warp reduces by shuffles
/// into `scratch[warp]`; once every peer has started (`cluster::wait`: before that a peer's
/// shared memory may not exist yet), threads `p < cluster::size()` combine the warps' keys
/// and push the block's key into `scratch[32 + rank]` of block `p`; after a cluster barrier
/// every block reduces the same keys in rank order; the last barrier lets the scratch be
/// reused.
#[cluster_primitive(shared(scratch: [u64; 48]), barriers = 3)]
pub fn argmax(_scope: &Cluster, data: SharedSlice<f32>) -> (f32, u32) {
    let (rank, n) = (cluster::block_rank(), data.len());
    cluster::arrive();
    block::sync();
    let mut best = 0u64;
    for i in block::stride_loop(0..n) {
        best = best.max(rank_key(data.load(i), rank * n as u32 + i as u32));
    }
    best = warp::reduce_max_u64(best);
    if warp::lane() == 0 {
        scratch.store(warp::index_in_block() as usize, best);
    }
    block::sync();
    cluster::wait();
    let peer = thread::rank_in_block();
    if peer < cluster::size() {
        let block_best = (0..block::warps() as usize).map(|w| scratch.load(w)).fold(0, u64::max);
        scratch.in_block(peer).store(32 + rank as usize, block_best);
    }
    cluster::sync();
    let total = (0..cluster::size() as usize).map(|r| scratch.load(32 + r)).fold(0, u64::max);
    cluster::sync();
    rank_unkey(total)
}

/// Block `b` loads `x[b*n ..]` into shared memory; every block writes its cluster's argmax
/// to `value[b]` and `index[b]`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn cluster_argmax(x: &[f32], value: Out<f32>, index: Out<u32>, n: u32) {
    let n = n as usize;
    let data = shared::dynamic().take::<f32>(n);
    let b = block::index_x() as usize;
    for i in block::stride_loop(0..n) {
        data.store(i, x[b * n + i]);
    }
    let (max, at) = argmax(&Cluster::new(), data);
    if thread::index_x() == 0 {
        value.set(b, max);
        index.set(b, at);
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub fn run(gpu: &Gpu) -> clusterfuse::host::Result<crate::check::Report> {
    use crate::check::{poisoned, random, with_rng, Report};
    use rand::Rng;
    let kernel = cluster_argmax::load(gpu)?;
    let (mut outs, mut refs) = (Vec::new(), Vec::new());
    let clusters = 3usize;
    for size in [1usize, 2, 3, 4, 8, 16] {
        for n in [1usize, 1000, 4103] {
            let (blocks, per_cluster) = (clusters * size, size * n);
            let mut x = random(blocks * n);
            // Cluster 1 gets a tie for its maximum, which the lower index must win.
            if per_cluster >= 2 {
                let (a, b) = with_rng(|rng| (rng.random_range(0..per_cluster), rng.random_range(0..per_cluster)));
                x[per_cluster + a] = 2.0;
                x[per_cluster + b] = 2.0;
            }
            let dx = gpu.upload(&x)?;
            let mut value = poisoned(gpu, blocks)?;
            let mut index = gpu.upload(&vec![u32::MAX; blocks])?;
            let config = LaunchConfig {
                grid: (blocks as u32).into(),
                block: 256.into(),
                cluster: Some((size as u32).into()),
                dynamic_smem_bytes: (n * 4) as u32,
                ..LaunchConfig::default()
            };
            kernel.launch(gpu.stream(), &config, &dx, &mut value, &mut index, n as u32)?;
            let (value, index) = (gpu.download(&value)?, gpu.download(&index)?);
            for b in 0..blocks {
                let cluster = &x[b / size * per_cluster..][..per_cluster];
                let (mut at, mut max) = (0, f64::NEG_INFINITY);
                for (i, &v) in cluster.iter().enumerate() {
                    if v as f64 > max {
                        (at, max) = (i, v as f64);
                    }
                }
                refs.extend([max, at as f64]);
                outs.extend([value[b], if index[b] == u32::MAX { f32::NAN } else { index[b] as f32 }]);
            }
        }
    }
    let shape = format!("argmax, clusters 1-16 × n 1,1000,4103, ties ({} B scratch)", argmax::FACTS.shared_bytes);
    Ok(Report::new(shape, &outs, &refs, 0.0))
}
