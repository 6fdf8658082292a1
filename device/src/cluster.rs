//! Cluster scope: the blocks of a thread-block cluster, their barrier, distributed shared
//! memory (DSMEM), and collectives with all-reduce / all-gather semantics.
//!
//! A kernel using these must be launched with a cluster (`#[kernel(cluster(..))]` or
//! `LaunchConfig::cluster`); every thread of every block of the cluster must call each
//! collective (they contain cluster barriers).

use crate::arch::{self, SharedWord};
use crate::out_of_bounds;
use crate::mbarrier::{Mbarrier, RemoteMbarrier};
use crate::ops::{Element, ReduceOp};
use crate::shared::SharedSlice;
use crate::{block, Dim3};
use core::marker::PhantomData;
use core::mem::size_of;

/// The block's rank in its cluster, `0 .. size()`.
#[inline(always)]
pub fn block_rank() -> u32 {
    arch::cluster_ctarank()
}

/// Blocks in the cluster.
#[inline(always)]
pub fn size() -> u32 {
    arch::cluster_nctarank()
}

/// The cluster's extent in blocks.
#[inline(always)]
pub fn dim() -> Dim3 {
    Dim3::new(arch::cluster_nctaid_x(), arch::cluster_nctaid_y(), arch::cluster_nctaid_z())
}

/// The cluster's index in the grid.
#[inline(always)]
pub fn index_in_grid() -> Dim3 {
    Dim3::new(arch::clusterid_x(), arch::clusterid_y(), arch::clusterid_z())
}

/// Cluster barrier, both halves: every thread of the cluster waits here, and writes before
/// it (to any block's shared memory) are visible to the whole cluster after it. The releasing
/// arrival compiles to `MEMBAR.ALL.GPU` on sm_90, which waits for the thread's memory
/// accesses in flight, global loads included: loads that need not precede the barrier go out
/// between [`arrive`] and [`wait`] instead, where they overlap it (example 12's split-K row
/// tail). A barrier that only keeps shared memory alive while peers read it can arrive
/// relaxed ([`sync_after_reads`]).
#[inline(always)]
pub fn sync() {
    arch::barrier_cluster_arrive_release();
    arch::barrier_cluster_wait_acquire();
}

/// First half of a split barrier: arrive (releasing earlier writes) and go on working.
#[inline(always)]
pub fn arrive() {
    arch::barrier_cluster_arrive_release();
}

/// Cluster barrier whose arrival is relaxed: it orders no memory, and only keeps every block
/// resident, its shared memory unchanged, until every peer has passed it. It closes a pass
/// whose threads read peers' shared memory and consume what they read before arriving, and
/// skips the device-wide fence (`MEMBAR.ALL.GPU`) that a releasing arrival costs after
/// global stores.
#[inline(always)]
pub fn sync_after_reads() {
    arrive_relaxed();
    wait();
}

/// First half of a split barrier whose arrival orders no memory, as [`sync_after_reads`]'s: a
/// block that has consumed every read of its peers' shared memory arrives here, goes on with
/// work that reads no peer's, and [`wait`]s before it leaves, so that the barrier's latency
/// overlaps that work.
#[inline(always)]
pub fn arrive_relaxed() {
    arch::barrier_cluster_arrive_relaxed();
}

/// Second half of a split barrier: wait for every thread of the cluster to [`arrive`] (or
/// [`arrive_relaxed`]).
#[inline(always)]
pub fn wait() {
    arch::barrier_cluster_wait_acquire();
}

/// The cluster scope token that every `#[cluster_primitive]` (the `clusterfuse` crate's) takes
/// first, so that collective calls read as such: `argmax(&scope, data)`.
///
/// Holding one is a promise, not a proof: every thread of every block of the cluster makes the
/// same sequence of collective calls (they contain cluster barriers, and a block that skips one
/// deadlocks its peers or exits while they read its shared memory). Any kernel may create it,
/// because a launch without a cluster is a cluster of one block, where every collective is
/// correct; making it a compile error to create outside `#[kernel(cluster(..))]` needs
/// `#[kernel]` to hand it out, which it does not yet.
#[derive(Clone, Copy, Default)]
pub struct Cluster(());

impl Cluster {
    /// The token; see the type's docs for what holding it promises.
    #[inline(always)]
    pub fn new() -> Self {
        Self(())
    }
}

/// What a `#[cluster_primitive]` declared, as `<primitive>::FACTS`: its static shared scratch
/// (part of the static shared memory of every kernel that calls it) and its cluster barriers
/// per call (declared by the author, not counted by the macro).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrimitiveFacts {
    /// The function's name.
    pub name: &'static str,
    /// Bytes of its static shared scratch, per block.
    pub shared_bytes: usize,
    /// Cluster barriers per call.
    pub barriers: u32,
}

/// The same shared array in another block of the cluster, reached through DSMEM.
#[derive(Clone, Copy)]
pub struct RemoteSlice<T> {
    addr: u32,
    len: u32,
    rank: u32,
    _element: PhantomData<T>,
}

impl<T: SharedWord> SharedSlice<T> {
    /// This array as it lives in the block of cluster rank `rank` (`mapa`); traps when
    /// `rank >= cluster::size()`.
    #[inline(always)]
    pub fn in_block(self, rank: u32) -> RemoteSlice<T> {
        if rank >= size() {
            out_of_bounds()
        }
        RemoteSlice { addr: arch::mapa_shared_cluster(self.addr(), rank), len: self.len() as u32, rank, _element: PhantomData }
    }
}

impl<T: SharedWord> RemoteSlice<T> {
    /// Number of elements.
    #[inline(always)]
    pub fn len(self) -> usize {
        self.len as usize
    }

    /// True when the view holds no elements.
    #[inline(always)]
    pub fn is_empty(self) -> bool {
        self.len == 0
    }

    /// Element `i` of the peer's array (`ld.shared::cluster`); traps when out of bounds.
    #[inline(always)]
    pub fn load(self, i: usize) -> T {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: in bounds; the address came from `mapa` of a live shared array, whose block
        // stays resident while read if a cluster barrier follows the reads (the emulator checks).
        unsafe { T::ld_shared_cluster(self.addr + (i * size_of::<T>()) as u32) }
    }

    /// Stores into element `i` of the peer's array (`st.shared::cluster`); traps when out of bounds.
    #[inline(always)]
    pub fn store(self, i: usize, value: T) {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: as for `load`.
        unsafe { T::st_shared_cluster(self.addr + (i * size_of::<T>()) as u32, value) }
    }

    /// Copies all of `src`, this block's, into the peer's array from element `at`: one
    /// asynchronous bulk copy (`cp.async.bulk`) issued by the calling thread, whose bytes
    /// complete on `barrier`, the peer's mbarrier. The peer learns of it by
    /// [`Mbarrier::wait`](crate::mbarrier::Mbarrier::wait) after announcing the bytes; `src`
    /// must stay unchanged until the issuing block knows the copy landed (e.g. after a
    /// cluster barrier that follows the peer's wait). The threads that wrote `src` must have
    /// called [`fence_async_copies`] before the barrier that precedes this call. Traps unless
    /// both ends are 16-byte aligned, the size is a non-zero multiple of 16 bytes, the range
    /// fits, and `barrier` is in the same block.
    #[inline(always)]
    pub fn copy_from(self, at: usize, src: SharedSlice<T>, barrier: RemoteMbarrier) {
        let bytes = src.len() * size_of::<T>();
        let dst = self.addr + (at * size_of::<T>()) as u32;
        let fits = at.checked_add(src.len()).is_some_and(|end| end <= self.len());
        if !fits || barrier.rank != self.rank || bytes == 0 || !bytes.is_multiple_of(16) || !dst.is_multiple_of(16) || !src.addr().is_multiple_of(16) {
            out_of_bounds()
        }
        // SAFETY: checked above: aligned, in bounds, destination and barrier in one block;
        // the caller keeps `src` and the destination untouched until the copy is known done.
        unsafe { arch::cp_async_bulk_shared_cluster_shared_cta(dst, src.addr(), bytes as u32, barrier.addr) }
    }
}

impl RemoteSlice<u64> {
    /// Stores into element `i` of the peer's array asynchronously (`st.async`), completing 8
    /// bytes of `barrier`, the peer's mbarrier: the peer learns of it by
    /// [`Mbarrier::wait`](crate::mbarrier::Mbarrier::wait) after announcing the bytes, and no
    /// fence orders it (a releasing cluster barrier after `store` costs a `MEMBAR.ALL.GPU`).
    /// Nothing may touch the element until then. Traps when out of bounds or when `barrier`
    /// is in another block; faults in a cluster of one block (the GPU needs two or more).
    #[inline(always)]
    pub fn store_async(self, i: usize, value: u64, barrier: RemoteMbarrier) {
        if i >= self.len() || barrier.rank != self.rank {
            out_of_bounds()
        }
        // SAFETY: in bounds (8-byte aligned, as every `u64` array) in the block of `barrier`;
        // the caller leaves the element alone until the barrier's phase completes.
        unsafe { arch::st_async_shared_cluster_b64(self.addr + (i * size_of::<u64>()) as u32, value, barrier.addr) }
    }
}

/// All-reduce of a shared vector across the cluster: afterwards every block's `data[i]` is
/// `op` over all blocks' `data[i]`.
///
/// Reduce-scatter then all-gather through DSMEM, in one pass between two cluster barriers:
/// block `r` owns the `r`-th contiguous chunk; its threads read each owned element from every
/// block in rank order `0, 1, ..` (so the result is deterministic and bitwise identical
/// everywhere) and store the result into every block. Where `data` is 16-byte aligned the
/// chunks are made of 16-byte vectors (`ld/st.shared::cluster.v4`, up to four peers' loads in
/// flight), and the last `< 16 / size_of::<T>()` elements (all of them, when `data` is not
/// aligned) go element by element. Each element
/// is read and written by its owner alone, so the pass needs only the barriers around it; the
/// trailing one also keeps every block resident until its shared memory is no longer read.
/// Safe to call repeatedly.
#[inline(always)]
pub fn reduce<T: Element + SharedWord, Op: ReduceOp<T>>(data: SharedSlice<T>, _op: Op) {
    let blocks = size();
    reduce_owned::<T, Op>(
        data,
        |words, v, result| {
            for peer in 0..blocks {
                words.in_block(peer).store(v, result);
            }
        },
        |tail, i, result| {
            for peer in 0..blocks {
                tail.in_block(peer).store(i, result);
            }
        },
    );
    sync();
}

/// Reduce-scatter of a shared vector across the cluster: `op` over all blocks' `data[i]`,
/// computed once for each `i` by the block that owns it (block `r` the `r`-th contiguous
/// chunk), which calls `emit(i, result)` from one of its threads. The reduction is [`reduce`]'s
/// (16-byte DSMEM loads, rank order, deterministic); nothing is written back, so the results
/// go where `emit` puts them, e.g. straight to global memory: a split-K GEMM's partial tiles,
/// one per block, summed into the output tile with each block writing `1/size()` of it.
/// Between two cluster barriers, like [`reduce`]; `data` must not be written until the
/// trailing one has passed.
#[inline(always)]
pub fn reduce_scatter<T: Element + SharedWord, Op: ReduceOp<T>>(data: SharedSlice<T>, _op: Op, emit: impl Fn(usize, T)) {
    let lanes = 16 / size_of::<T>();
    reduce_owned::<T, Op>(
        data,
        |_, v, result| {
            for k in 0..lanes {
                // SAFETY: lane `k` lies inside the 16-byte vector, which holds bits of `T`s.
                emit(v * lanes + k, unsafe { (result.as_ptr() as *const T).add(k).read_unaligned() });
            }
        },
        |tail, i, result| emit(data.len() - tail.len() + i, result),
    );
    // Only keeps `data` from being overwritten (or its block from exiting) while a peer may
    // still read it.
    sync_after_reads();
}

/// The pass [`reduce`] and [`reduce_scatter`] share, after a cluster barrier: this block's
/// threads reduce each owned 16-byte vector of `data` (`vector(words, v, result)`) and each
/// owned element of its unaligned tail (`element(tail, i, result)`) over the blocks in rank
/// order.
#[inline(always)]
fn reduce_owned<T: Element + SharedWord, Op: ReduceOp<T>>(
    data: SharedSlice<T>,
    mut vector: impl FnMut(SharedSlice<[u32; 4]>, usize, [u32; 4]),
    mut element: impl FnMut(SharedSlice<T>, usize, T),
) {
    const { assert!(16 % size_of::<T>() == 0, "cluster collectives need an element size that divides 16 bytes") };
    let blocks = size();
    let lanes = 16 / size_of::<T>();
    let vectors = if data.addr().is_multiple_of(16) { data.len() / lanes } else { 0 };
    // SAFETY: the first `vectors * 16` bytes of `data`'s own memory, which is 16-byte aligned
    // (checked above); `T` and `[u32; 4]` are both plain bits.
    let words = unsafe { SharedSlice::<[u32; 4]>::from_raw_parts(data.addr(), vectors) };
    // SAFETY: the rest of `data` after those vectors (`vectors * lanes <= data.len()`). Not
    // `data.slice`: its check, which cannot wrap, is one ptxas then schedules between the
    // four DSMEM loads of `combine_peers` (`examples/tests/ptx.rs`).
    let tail = unsafe { SharedSlice::<T>::from_raw_parts(data.addr() + (vectors * 16) as u32, data.len() - vectors * lanes) };
    sync();
    for v in owned_by_this_thread(vectors) {
        vector(words, v, combine_vector::<T, Op>(words, v));
    }
    for i in owned_by_this_thread(tail.len()) {
        element(tail, i, (0..blocks).fold(Op::identity(), |acc, peer| Op::combine(acc, tail.in_block(peer).load(i))));
    }
}

/// This thread's indices of this block's contiguous share of `0 .. len`.
#[inline(always)]
fn owned_by_this_thread(len: usize) -> block::StrideLoop {
    let chunk = (len as u32).div_ceil(size()) as usize;
    let start = (block_rank() as usize * chunk).min(len);
    block::stride_loop(start..(start + chunk).min(len))
}

/// `Op` over every block's 16-byte vector `v` of `words` (lanes of `T`), lane by lane, from the
/// identity in rank order, up to four peers' loads in flight: the value [`reduce`] and
/// [`reduce_scatter`] compute for each vector, for a caller that shares the vectors out its
/// own way (deterministic, the same in every block).
#[inline(always)]
pub fn combine_vector<T: Element, Op: ReduceOp<T>>(words: SharedSlice<[u32; 4]>, v: usize) -> [u32; 4] {
    combine_peers(size(), splat16(Op::identity()), |peer| words.in_block(peer), |peer_words| peer_words.load(v), combine16::<T, Op>)
}

/// `combine` over `init, read(at(0)), read(at(1)), .., read(at(blocks - 1))`, in that order,
/// issuing up to four reads before their results are needed. A group's views (`at`, which
/// checks the rank) are all made before its reads, so that no branch separates the loads:
/// with the checks between them, ptxas put the first value's adds before the other loads,
/// which then waited for it, a DSMEM round trip a group of four (`results/clusters-h200.md`).
#[inline(always)]
fn combine_peers<P: Copy, V: Copy>(blocks: u32, init: V, at: impl Fn(u32) -> P, read: impl Fn(P) -> V, combine: impl Fn(V, V) -> V) -> V {
    let mut acc = init;
    let mut peer = 0;
    while peer + 4 <= blocks {
        let views = (at(peer), at(peer + 1), at(peer + 2), at(peer + 3));
        let (a, b, c, d) = (read(views.0), read(views.1), read(views.2), read(views.3));
        acc = combine(combine(combine(combine(acc, a), b), c), d);
        peer += 4;
    }
    let rest = blocks - peer;
    if rest > 0 {
        let views = (at(peer), (rest > 1).then(|| at(peer + 1)), (rest > 2).then(|| at(peer + 2)));
        let (a, b, c) = (read(views.0), views.1.map(&read), views.2.map(&read));
        acc = combine(acc, a);
        if let Some(b) = b {
            acc = combine(acc, b);
        }
        if let Some(c) = c {
            acc = combine(acc, c);
        }
    }
    acc
}

/// `value` in every lane of a 16-byte vector.
#[inline(always)]
fn splat16<T: Copy>(value: T) -> [u32; 4] {
    let mut out = [0u32; 4];
    for k in 0..16 / size_of::<T>() {
        // SAFETY: lane `k` lies inside the 16 bytes of `out`; unaligned writes need no alignment.
        unsafe { (out.as_mut_ptr() as *mut T).add(k).write_unaligned(value) };
    }
    out
}

/// `Op::combine` lane by lane on two 16-byte vectors of `T`.
#[inline(always)]
fn combine16<T: Element, Op: ReduceOp<T>>(a: [u32; 4], b: [u32; 4]) -> [u32; 4] {
    let mut out = [0u32; 4];
    for k in 0..16 / size_of::<T>() {
        // SAFETY: lane `k` lies inside each 16-byte vector; the vectors hold bits of valid `T`
        // values (they were loaded from a `SharedSlice<T>`).
        unsafe {
            let (x, y) = ((a.as_ptr() as *const T).add(k).read_unaligned(), (b.as_ptr() as *const T).add(k).read_unaligned());
            (out.as_mut_ptr() as *mut T).add(k).write_unaligned(Op::combine(x, y));
        }
    }
    out
}

/// Makes this thread's earlier ordinary stores to shared memory visible to asynchronous bulk
/// copies ([`RemoteSlice::copy_from`]) issued after the next barrier (`fence.proxy.async`).
#[inline(always)]
pub fn fence_async_copies() {
    arch::fence_proxy_async_shared_cta();
}

/// All-reduce of one value per thread over the whole cluster, in two levels: the block's
/// threads reduce with [`block::reduce`] (warp shuffles, then the warps' partials through
/// `scratch[..32]`), then thread `r` of every block stores the block's total into
/// `scratch[32 + rank]` of block `r` through DSMEM, and every block combines the totals in rank
/// order, so every thread of the cluster gets the same, deterministic result. `scratch` holds
/// at least 48 values. Every thread of the cluster must call it; safe to call repeatedly.
#[inline(always)]
pub fn reduce_value<T: Element + SharedWord, Op: ReduceOp<T>>(value: T, op: Op, scratch: SharedSlice<T>) -> T {
    const TOTALS: usize = 32;
    if scratch.len() < TOTALS + crate::limits::MAX_CLUSTER_SIZE as usize {
        out_of_bounds()
    }
    let (rank, blocks) = (block_rank(), size());
    // Peers must have started before anything is pushed into their shared memory.
    arrive();
    let total = block::reduce(value, op, scratch);
    wait();
    for peer in block::stride_loop(0..blocks as usize) {
        scratch.in_block(peer as u32).store(TOTALS + rank as usize, total);
    }
    sync();
    let mut result = Op::identity();
    for r in 0..blocks as usize {
        result = Op::combine(result, scratch.load(TOTALS + r));
    }
    // Nobody may push the next call's totals before every block has read these.
    sync();
    result
}

/// All-gather: every block's `tile` lands in every block's `all`, block `r`'s at
/// `all[r * tile.len() ..]` (`all` holds `cluster::size() * tile.len()` elements). Safe to
/// call repeatedly.
#[inline(always)]
pub fn gather<T: SharedWord>(tile: SharedSlice<T>, all: SharedSlice<T>) {
    let rank = block_rank() as usize;
    let m = tile.len();
    sync();
    let mut i = crate::thread::rank_in_block() as usize;
    while i < m {
        let value = tile.load(i);
        for peer in 0..size() {
            all.in_block(peer).store(rank * m + i, value);
        }
        i += block::size() as usize;
    }
    sync();
}

/// All-gather as [`gather`], through bulk copies: thread 0 of each block pushes its whole
/// `tile` to every peer with one `cp.async.bulk` each, while the block's threads copy it into
/// their own `all`; every block waits on its own `barrier` (an [`Mbarrier`] with one arrival
/// per phase) until the peers' tiles have landed. `tile` must be a multiple of 16 bytes. The
/// closing cluster barrier orders the local copy and keeps every `tile` unchanged until all
/// copies from it have landed, so it is safe to call repeatedly.
#[inline(always)]
pub fn gather_bulk<T: SharedWord>(tile: SharedSlice<T>, all: SharedSlice<T>, barrier: &mut Mbarrier) {
    let (rank, m, blocks) = (block_rank(), tile.len(), size());
    fence_async_copies();
    sync();
    if crate::thread::rank_in_block() == 0 {
        barrier.arrive_expect_tx((blocks - 1) * (m * size_of::<T>()) as u32);
        for peer in (0..blocks).filter(|&peer| peer != rank) {
            all.in_block(peer).copy_from(rank as usize * m, tile, barrier.in_block(peer));
        }
    }
    for i in block::stride_loop(0..m) {
        all.store(rank as usize * m + i, tile.load(i));
    }
    barrier.wait();
    sync();
}

/// Broadcast: every block's `data` becomes block `root`'s. Safe to call repeatedly.
#[inline(always)]
pub fn broadcast<T: SharedWord>(data: SharedSlice<T>, root: u32) {
    sync();
    if block_rank() != root {
        let source = data.in_block(root);
        let mut i = crate::thread::rank_in_block() as usize;
        while i < data.len() {
            data.store(i, source.load(i));
            i += block::size() as usize;
        }
    }
    sync();
}
