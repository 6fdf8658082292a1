//! Kernels with deliberate bugs, each next to its corrected form: the CPU emulator must
//! report every bug (`tests/emulator.rs`), and pass the corrected kernels. Not a lesson.

use clusterfuse::prelude::*;

/// Reverses each block's 256 values through shared memory. With `synced == 0` the barrier
/// between the store and the other thread's load is missing: a race.
#[kernel(launch_bounds(max_threads = 256))]
pub fn reverse(x: &[f32], out: Out<f32>, synced: u32) {
    let tile = shared!([f32; 256]);
    let t = thread::index_x() as usize;
    let base = block::index_x() as usize * 256;
    tile.store(t, x[base + t]);
    if synced != 0 {
        block::sync();
    }
    out.set(base + t, tile.load(255 - t));
}

/// Threads below `waiting` wait at a barrier the others never reach (they return first).
#[kernel]
pub fn divergent_barrier(out: Out<f32>, waiting: u32) {
    if thread::index_x() < waiting {
        block::sync();
    }
    out.set(thread::global_index_x(), 1.0);
}

/// Reads `shared!([f32; 64])[index]`: out of bounds for `index >= 64`.
#[kernel]
pub fn shared_index(out: Out<f32>, index: u32) {
    let tile = shared!([f32; 64]);
    if thread::index_x() == 0 {
        tile.store(0, 1.0);
        out.set(0, tile.load(index as usize));
    }
}

/// Block 0 reads block 1's shared value through DSMEM. With `keep_alive == 0` block 1 does
/// not wait for it at a cluster barrier before exiting; with `started == 0` block 0 reads
/// before any cluster barrier, when block 1 may not have started.
#[kernel(cluster(2))]
pub fn peer_read(out: Out<f32>, keep_alive: u32, started: u32) {
    let value = shared!([f32; 1]);
    let rank = cluster::block_rank();
    if thread::index_x() == 0 {
        value.store(0, rank as f32 + 1.0);
    }
    if started == 0 && rank == 0 && thread::index_x() == 0 {
        out.set(0, value.in_block(1).load(0));
    }
    cluster::sync();
    if rank == 0 && thread::index_x() == 0 {
        out.set(0, value.in_block(1).load(0));
    }
    if keep_alive != 0 {
        cluster::sync();
    }
}

/// Each block of a cluster of 2 pushes a 4-float tile into its peer with a bulk copy and
/// reads what it received; with `waited == 0` it reads before waiting on its mbarrier.
#[kernel(cluster(2))]
pub fn bulk_exchange(out: Out<f32>, waited: u32) {
    let mut smem = shared::dynamic();
    let (tile, received, slot) = (smem.take::<f32>(4), smem.take::<f32>(4), smem.take::<u64>(1));
    let mut barrier = clusterfuse::mbarrier::Mbarrier::new(slot, 1);
    let (rank, t) = (cluster::block_rank(), thread::index_x() as usize);
    if t < 4 {
        tile.store(t, (rank * 4) as f32 + t as f32);
    }
    cluster::fence_async_copies();
    cluster::sync();
    if t == 0 {
        barrier.arrive_expect_tx(16);
        received.in_block(1 - rank).copy_from(0, tile, barrier.in_block(1 - rank));
    }
    if waited != 0 {
        barrier.wait();
    }
    if t < 4 {
        out.set(rank as usize * 4 + t, received.load(t));
    }
    cluster::sync();
}
