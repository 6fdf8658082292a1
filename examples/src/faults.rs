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

/// Warpgroup 1 of each 256-thread block reverses its 128 values through shared memory while
/// warpgroup 0 exits at once: with `synced == 0` its own barrier (`Warpgroup::sync`, which
/// the exited warpgroup does not hold up) is missing between the store and the load, a race.
#[kernel(launch_bounds(max_threads = 256))]
pub fn warpgroup_reverse(out: Out<f32>, synced: u32) {
    let tile = shared!([f32; 128]);
    let wg = clusterfuse::warpgroup::Warpgroup::current();
    if wg.index() == 0 {
        return;
    }
    let t = wg.thread_rank() as usize;
    tile.store(t, t as f32);
    if synced != 0 {
        wg.sync();
    }
    out.set(block::index_x() as usize * 128 + t, tile.load(127 - t));
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

/// Takes `n` f32 of the launch's dynamic shared memory and writes how many it got. A count
/// whose bytes overflow 32 bits (`n > 2^30`) must trap, not wrap to a few bytes that fit.
#[kernel]
pub fn dynamic_take(out: Out<u32>, n: u32) {
    let data = shared::dynamic().take::<f32>(n as usize);
    if thread::index_x() == 0 {
        out.set(0, data.len() as u32);
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
    // SAFETY: its own shared word, and the cluster barrier below before its first use.
    let mut barrier = unsafe { clusterfuse::mbarrier::Mbarrier::new(slot, 1) };
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

/// Each block of a cluster of 2 posts 4 words into its peer's mailbox and, with `waited != 0`,
/// waits for its own and reads them; no cluster barrier ends the kernel, since a block that
/// has waited for its mailbox is no longer written. With `waited == 0` a block expecting
/// `expected` words exits without waiting: a bug unless every word has landed by then.
#[kernel(cluster(2))]
pub fn mailbox_exchange(out: Out<f32>, expected: u32, waited: u32) {
    let mut smem = shared::dynamic();
    // SAFETY: its own shared words; thread 0 (which initialised it) expects before the cluster
    // barrier below, and the posts come after it.
    let mut mailbox = unsafe { clusterfuse::mbarrier::Mailbox::new(smem.take::<u64>(4), smem.take::<u64>(1)) };
    let (rank, t) = (cluster::block_rank(), thread::index_x() as usize);
    if t == 0 {
        mailbox.expect(expected as usize);
    }
    cluster::arrive_relaxed();
    cluster::wait();
    if t < 4 {
        mailbox.post(1 - rank, t, (rank * 4) as u64 + t as u64);
    }
    if waited != 0 {
        mailbox.wait();
        if t < 4 {
            out.set(rank as usize * 4 + t, mailbox.words().load(t) as f32);
        }
    }
}

/// Stages of [`fn@bulk_stream`]'s rings.
pub const STREAM_STAGES: usize = 2;

/// `out = 2·x`, each warp streaming its `x.len() / warps` values through a ring of
/// [`STREAM_STAGES`] 32-float stages of its own: lane 0 loads a stage with one bulk copy
/// from global memory, all 32 lanes consume it. With `waited == 0` the lanes read a stage
/// without waiting for its copy: a race. Dynamic shared memory: `(128 + 16) · STREAM_STAGES`
/// bytes per warp.
#[kernel(launch_bounds(max_threads = 256))]
pub fn bulk_stream(x: &[f32], out: Out<f32>, waited: u32) {
    use clusterfuse::tma::{Pipeline, PipelineState};
    let warps = block::size() as usize / 32;
    let (warp, lane) = (warp::index_in_block() as usize, warp::lane() as usize);
    let mut smem = shared::dynamic();
    let ring = smem.take::<f32>(warps * STREAM_STAGES * 32).slice(warp * STREAM_STAGES * 32, STREAM_STAGES * 32);
    // SAFETY: its own shared words, and the block barrier right after.
    let pipeline = unsafe { Pipeline::<STREAM_STAGES>::per_warp(smem.take::<u64>(warps * 2 * STREAM_STAGES), 32) };
    block::sync();
    let (chunks, base) = (x.len() / warps / 32, warp * x.len() / warps);
    let load = |state: PipelineState<STREAM_STAGES>, chunk: usize| {
        if lane == 0 && chunk < chunks {
            let full = pipeline.producer_acquire(state, 128);
            let (src, dst) = (&x[base + 32 * chunk..base + 32 * chunk + 32], ring.slice(state.stage() * 32, 32));
            // SAFETY: `full` expects the copy's 128 bytes (`producer_acquire`); the stage is
            // free: its consumers released it before the producer's acquire returned.
            unsafe { dst.load_async(src, full) };
        }
    };
    let mut ahead = PipelineState::START;
    for chunk in 0..STREAM_STAGES {
        load(ahead, chunk);
        ahead = ahead.next();
    }
    let mut state = PipelineState::START;
    for chunk in 0..chunks {
        if waited != 0 {
            pipeline.consumer_wait(state);
        }
        let v = ring.load(state.stage() * 32 + lane);
        pipeline.consumer_release(state);
        load(ahead, chunk + STREAM_STAGES);
        ahead = ahead.next();
        out.set(base + 32 * chunk + lane, 2.0 * v);
        state = state.next();
    }
}

/// Values per tile of [`fn@published_chain`].
pub const CHAIN_TILE: usize = 64;

/// A persistent two-stage chain across blocks: stage 1 writes `y = 2x` tile by tile (the grid's
/// blocks taking tiles round robin) and publishes each tile; stage 2 writes tile `t` of
/// `z = y + 1` from tile `t + 1` of `y` (the next tile round, which another block wrote), after
/// waiting for it — with `alone` nonzero, each thread by itself (`Published::wait_alone`, no
/// block barrier), reading only its own elements. With `skip < tiles`, tile `skip` of `y` is
/// written but never published: the block that waits for it waits forever, a deadlock.
#[kernel(persistent, launch_bounds(max_threads = 128))]
pub fn published_chain(x: &[f32], y: Published<f32>, z: Out<f32>, skip: u32, alone: u32) {
    let tiles = y.tiles() as u32;
    for t in grid::round_robin(tiles, 0) {
        let tile = t as usize * CHAIN_TILE..(t as usize + 1) * CHAIN_TILE;
        for i in block::stride_loop(tile.clone()) {
            y.set(i, 2.0 * x[i]);
        }
        if t != skip {
            y.publish(t as usize..t as usize + 1);
        }
    }
    for t in grid::round_robin(tiles, 0) {
        let source = (t as usize + 1) % tiles as usize * CHAIN_TILE;
        let ready = if alone != 0 { y.wait_alone(source..source + CHAIN_TILE) } else { y.wait(source..source + CHAIN_TILE) };
        for i in block::stride_loop(0..CHAIN_TILE) {
            z.set(t as usize * CHAIN_TILE + i, ready.get(source + i) + 1.0);
        }
    }
}
