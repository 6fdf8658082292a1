//! Kernels of the `cluster-bench` benchmark (`src/bin/cluster-bench.rs`). Each times its
//! operation in-kernel: thread 0 of every block reads `clock64` after a cluster barrier and
//! again after the operation (which ends in a barrier), `reps` times; `cycles[b * reps + r]`
//! holds block `b`'s cycles of repetition `r`.

use clusterfuse::arch;
use clusterfuse::mbarrier::Mbarrier;
use clusterfuse::prelude::*;

/// Runs `op` between two `clock64` reads taken after a cluster barrier, and records the
/// difference for repetition `rep`.
#[inline(always)]
fn timed(cycles: &Out<u64>, reps: usize, rep: usize, op: impl FnOnce()) {
    cluster::sync();
    let start = arch::clock64();
    op();
    let end = arch::clock64();
    if thread::rank_in_block() == 0 {
        cycles.set(block::index_x() as usize * reps + rep, end - start);
    }
}

/// Loads block `b`'s `x[b*n ..]` into `data` (16 bytes per access; `n` is a multiple of 4).
#[inline(always)]
fn load_vector(x: &[f32], data: SharedSlice<f32>) {
    let first = block::index_x() as usize * data.len() / 4;
    for v in block::stride_loop(0..data.len() / 4) {
        data.store16(v, global::load16::<f32, 4>(x, first + v));
    }
}

/// Stores `data` to block `b`'s `out[b*n ..]`.
#[inline(always)]
fn store_vector(data: SharedSlice<f32>, out: &Out<f32>) {
    let first = block::index_x() as usize * data.len() / 4;
    for v in block::stride_loop(0..data.len() / 4) {
        out.store16(first + v, data.load16::<4>(v));
    }
}

/// All-reduce (sum) of each block's `x[b*n ..]` across the cluster with `cluster::reduce`,
/// `reps` times (reloading `x` untimed before each); the last result goes to `out`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn bench_reduce(x: &[f32], out: Out<f32>, cycles: Out<u64>, n: u32, reps: u32) {
    let data = shared::dynamic().take::<f32>(n as usize);
    for rep in 0..reps as usize {
        load_vector(x, data);
        timed(&cycles, reps as usize, rep, || cluster::reduce(data, Sum));
    }
    store_vector(data, &out);
}

/// The same all-reduce through global memory: every block writes its vector to
/// `scratch[b*n ..]`, a cluster barrier orders the writes, and every block sums all of its
/// cluster's vectors in rank order from global memory (16-byte accesses throughout); a
/// second barrier lets `scratch` be rewritten, as `cluster::reduce` may be called again.
#[kernel(launch_bounds(max_threads = 256))]
pub fn bench_reduce_global(x: &[f32], out: Out<f32>, scratch: Out<f32>, cycles: Out<u64>, n: u32, reps: u32) {
    let data = shared::dynamic().take::<f32>(n as usize);
    let vectors = n as usize / 4;
    let first_block = (block::index_x() - cluster::block_rank()) as usize;
    for rep in 0..reps as usize {
        load_vector(x, data);
        timed(&cycles, reps as usize, rep, || {
            store_vector(data, &scratch);
            cluster::sync();
            for v in block::stride_loop(0..vectors) {
                let mut acc = [0.0f32; 4];
                for peer in 0..cluster::size() as usize {
                    let w = scratch.load16::<4>((first_block + peer) * vectors + v);
                    acc = [acc[0] + w[0], acc[1] + w[1], acc[2] + w[2], acc[3] + w[3]];
                }
                data.store16(v, acc);
            }
            cluster::sync();
        });
    }
    store_vector(data, &out);
}

/// The naive DSMEM all-reduce: every block reads every peer's whole vector with scalar
/// DSMEM loads, in rank order, into a second shared vector (writing its own in place would
/// race with peers still reading it); the result goes to `out`.
#[kernel(launch_bounds(max_threads = 256))]
pub fn bench_reduce_naive(x: &[f32], out: Out<f32>, cycles: Out<u64>, n: u32, reps: u32) {
    let mut smem = shared::dynamic();
    let (data, result) = (smem.take::<f32>(n as usize), smem.take::<f32>(n as usize));
    for rep in 0..reps as usize {
        load_vector(x, data);
        timed(&cycles, reps as usize, rep, || {
            cluster::sync();
            for i in block::stride_loop(0..n as usize) {
                let mut acc = 0.0f32;
                for peer in 0..cluster::size() {
                    acc += data.in_block(peer).load(i);
                }
                result.store(i, acc);
            }
            cluster::sync();
        });
    }
    store_vector(result, &out);
}

/// `count` back-to-back cluster barriers, `reps` times: `cluster::sync()` (arrive.release +
/// wait.acquire), or with `relaxed != 0` arrive.relaxed + wait.acquire.
#[kernel(launch_bounds(max_threads = 256))]
pub fn bench_barrier(cycles: Out<u64>, count: u32, relaxed: u32, reps: u32) {
    for rep in 0..reps as usize {
        timed(&cycles, reps as usize, rep, || {
            if relaxed != 0 {
                for _ in 0..count {
                    cluster::arrive_relaxed();
                    cluster::wait();
                }
            } else {
                for _ in 0..count {
                    cluster::sync();
                }
            }
        });
    }
}

/// DSMEM read bandwidth: every block fills its dynamic shared memory (`vectors` 16-byte
/// vectors, a multiple of 4 × the block size), then reads block `(rank + 1) % size`'s copy
/// `passes` times with 16-byte loads (four in flight per thread), `reps` times. The timed
/// region ends with a block barrier, so it covers every thread's loads. `sink` gets each
/// thread's XOR of what it read, so the loads cannot be dropped.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn bench_dsmem_read(sink: Out<u32>, cycles: Out<u64>, vectors: u32, passes: u32, reps: u32) {
    let words = shared::dynamic().take::<[u32; 4]>(vectors as usize);
    for i in block::stride_loop(0..vectors as usize) {
        words.store(i, [i as u32, !(i as u32), cluster::block_rank(), 0x9e37_79b9]);
    }
    let peer = words.in_block((cluster::block_rank() + 1) % cluster::size());
    let mut acc = 0u32;
    for rep in 0..reps as usize {
        timed(&cycles, reps as usize, rep, || {
            let threads = block::size() as usize;
            for _ in 0..passes {
                let mut i = thread::index_x() as usize;
                while i < vectors as usize {
                    let (a, b, c, d) = (peer.load(i), peer.load(i + threads), peer.load(i + 2 * threads), peer.load(i + 3 * threads));
                    for k in 0..4 {
                        acc ^= a[k] ^ b[k] ^ c[k] ^ d[k];
                    }
                    i += 4 * threads;
                }
            }
            block::sync();
        });
    }
    sink.set(thread::global_index_x(), acc);
    cluster::sync();
}

/// How [`fn@bench_gather`] moves every block's tile to every block of its cluster.
pub mod gather_mode {
    /// Each thread stores its vectors into every peer's `all` (`cluster::gather`, 16-byte
    /// remote stores).
    pub const PUSH: u32 = 0;
    /// Each thread loads its vectors of every peer's tile into its own `all` (16-byte
    /// remote loads), as example 12's split-K row tail reads its peers' partial rows.
    pub const PULL: u32 = 1;
    /// Thread 0 copies the whole tile into every peer's `all`, one bulk copy a peer
    /// (`cluster::gather_bulk`).
    pub const BULK: u32 = 2;
}

/// DSMEM all-gather bandwidth: every block's tile of `vectors` 16-byte vectors lands in every
/// block's `all`, `reps` times, each timed from a cluster barrier to the end of the gather
/// (which closes with one), moved as `mode` says ([`gather_mode`]). `sink` gets each thread's
/// XOR of what landed, so the moves cannot be dropped.
#[kernel(launch_bounds(max_threads = 1024))]
pub fn bench_gather(sink: Out<u32>, cycles: Out<u64>, vectors: u32, mode: u32, reps: u32) {
    let (rank, blocks, m) = (cluster::block_rank(), cluster::size() as usize, vectors as usize);
    let mut smem = shared::dynamic();
    let (tile, all) = (smem.take::<[u32; 4]>(m), smem.take::<[u32; 4]>(blocks * m));
    // SAFETY: its own shared word; only `gather_bulk` uses it, which opens with a cluster barrier.
    let mut barrier = unsafe { Mbarrier::new(smem.take::<u64>(1), 1) };
    for i in block::stride_loop(0..m) {
        tile.store(i, [i as u32, !(i as u32), rank, 0x9e37_79b9]);
    }
    for rep in 0..reps as usize {
        timed(&cycles, reps as usize, rep, || match mode {
            gather_mode::PUSH => cluster::gather(tile, all),
            gather_mode::PULL => {
                for i in block::stride_loop(0..blocks * m) {
                    all.store(i, tile.in_block((i / m) as u32).load(i % m));
                }
                cluster::sync();
            }
            _ => cluster::gather_bulk(tile, all, &mut barrier),
        });
    }
    let mut acc = 0u32;
    for i in block::stride_loop(0..blocks * m) {
        acc ^= all.load(i).iter().fold(0, |a, w| a ^ w);
    }
    sink.set(thread::global_index_x(), acc);
    cluster::sync();
}

/// Spins thread 0 of block 0 for `target` cycles of `clock64` and records how many passed:
/// timed with events on the host, it gives the SM clock.
#[kernel(launch_bounds(max_threads = 32))]
pub fn bench_spin(cycles: Out<u64>, target: u64) {
    if thread::index_x() == 0 && block::index_x() == 0 {
        let start = arch::clock64();
        let mut now = start;
        while now - start < target {
            now = arch::clock64();
        }
        cycles.set(0, now - start);
    }
}
