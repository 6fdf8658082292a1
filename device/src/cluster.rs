//! Cluster scope: the blocks of a thread-block cluster, their barrier, distributed shared
//! memory (DSMEM), and collectives with all-reduce / all-gather semantics.
//!
//! A kernel using these must be launched with a cluster (`#[kernel(cluster(..))]` or
//! `LaunchConfig::cluster`); every thread of every block of the cluster must call each
//! collective (they contain cluster barriers).

use crate::arch::{self, SharedWord};
use crate::out_of_bounds;
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
/// it (to any block's shared memory) are visible to the whole cluster after it.
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

/// Second half of a split barrier: wait for every thread of the cluster to [`arrive`].
#[inline(always)]
pub fn wait() {
    arch::barrier_cluster_wait_acquire();
}

/// The same shared array in another block of the cluster, reached through DSMEM.
#[derive(Clone, Copy)]
pub struct RemoteSlice<T> {
    addr: u32,
    len: u32,
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
        RemoteSlice { addr: arch::mapa_shared_cluster(self.addr(), rank), len: self.len() as u32, _element: PhantomData }
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
        // SAFETY: in bounds; the address came from `mapa` of a live shared array, and the
        // cluster's blocks are co-resident until the kernel ends.
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
}

/// All-reduce of a shared vector across the cluster: afterwards every block's `data[i]` is
/// `op` over all blocks' `data[i]`.
///
/// Reduce-scatter then all-gather through DSMEM: block `r` owns the `r`-th contiguous chunk;
/// its threads read element `i` of that chunk from every block in rank order `0, 1, ..`
/// (so the result is deterministic and bitwise identical everywhere), then store the result
/// into every block's `data[i]`. Each element is read and written by its owner alone, so the
/// two phases need only the two cluster barriers around them; the trailing one also keeps
/// every block resident until its shared memory is no longer read. Safe to call repeatedly.
#[inline(always)]
pub fn reduce<T: Element + SharedWord, Op: ReduceOp<T>>(data: SharedSlice<T>, _op: Op) {
    let blocks = size();
    let rank = block_rank();
    let n = data.len();
    let chunk = n.div_ceil(blocks as usize);
    let start = (rank as usize * chunk).min(n);
    let end = (start + chunk).min(n);
    sync();
    let mut i = start + crate::thread::rank_in_block() as usize;
    while i < end {
        let mut acc = Op::identity();
        for peer in 0..blocks {
            acc = Op::combine(acc, data.in_block(peer).load(i));
        }
        for peer in 0..blocks {
            data.in_block(peer).store(i, acc);
        }
        i += block::size() as usize;
    }
    sync();
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
