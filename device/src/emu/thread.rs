//! One emulated thread: its special registers, its place in the cluster, and the barriers it
//! has passed (what the race check compares).

use super::fiber::Yielder;
use super::schedule::Cluster;
use crate::Dim3;
use core::cell::{Cell, RefCell};
use std::vec::Vec;
use core::ptr;

/// The special registers of one thread, as PTX defines them.
#[derive(Clone, Copy, Debug)]
pub struct Registers {
    /// `%tid`.
    pub tid: Dim3,
    /// `%ntid`.
    pub ntid: Dim3,
    /// `%ctaid`.
    pub ctaid: Dim3,
    /// `%nctaid`.
    pub nctaid: Dim3,
    /// `%laneid`.
    pub lane: u32,
    /// `%dynamic_smem_size`.
    pub dynamic_smem_size: u32,
    /// `%cluster_ctarank`.
    pub cluster_rank: u32,
    /// `%cluster_ctaid`.
    pub cluster_ctaid: Dim3,
    /// `%cluster_nctaid`.
    pub cluster_nctaid: Dim3,
    /// `%clusterid`.
    pub clusterid: Dim3,
    /// `%nclusterid`.
    pub nclusterid: Dim3,
}

/// How many barriers of each scope a thread has passed. A write is ordered before a read
/// when the reader has since passed a barrier, of a scope holding both, that counts past the
/// writer's: e.g. the block epoch after a `bar.sync` both reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epochs {
    pub warp: u32,
    pub block: u32,
    pub cluster: u32,
}

/// A thread of an emulated cluster.
pub struct Thread {
    pub registers: Registers,
    /// Rank of its block in the cluster.
    pub rank: u32,
    /// Linear index in its block.
    pub index: u32,
    /// Linear index in its cluster: the identity the race check records.
    pub id: u32,
    pub epochs: Cell<Epochs>,
    /// The cluster-barrier phase this thread has arrived at and not yet waited for.
    pub cluster_arrival: Cell<Option<u32>>,
    /// Phases of each mbarrier (by index) this thread has seen complete, itself or through
    /// the mbarrier phases it waited for (what their arrivals had seen).
    pub mbarrier_phases: RefCell<Vec<u32>>,
    /// mbarrier arrivals this thread has made.
    pub arrivals: Cell<u32>,
    /// Per thread of the cluster (by id), how many of its mbarrier arrivals this thread has
    /// learned of by waiting for their phases: the accesses it made before them are ordered
    /// before this thread's.
    pub known_arrivals: RefCell<Vec<u32>>,
    /// The global words this thread last read with `ld.acquire`: what it spins on when it
    /// sleeps.
    pub spin: Cell<Option<super::ops::Spin>>,
    pub cluster: *const Cluster,
    pub yielder: Cell<*const Yielder>,
}

impl Thread {
    /// Index of its warp in the block.
    pub fn warp(&self) -> u32 {
        self.index / crate::limits::WARP_SIZE
    }

    /// The cluster it belongs to.
    pub fn cluster(&self) -> &Cluster {
        // SAFETY: the scheduler keeps the cluster alive while any of its threads runs.
        unsafe { &*self.cluster }
    }
}

std::thread_local! {
    static CURRENT: Cell<*const Thread> = const { Cell::new(ptr::null()) };
}

/// Runs `f` with the thread the calling fiber emulates.
pub fn with_current<R>(f: impl FnOnce(&Thread) -> R) -> R {
    let current = CURRENT.get();
    assert!(
        !current.is_null(),
        "device code ran on the host outside a launch: launch the kernel, on a GPU or on the emulator"
    );
    // SAFETY: set by `enter` for the duration of a fiber's run; the thread outlives it.
    f(unsafe { &*current })
}

/// Makes `thread` current until the guard drops.
pub fn enter(thread: &Thread) -> impl Drop {
    struct Leave(*const Thread);
    impl Drop for Leave {
        fn drop(&mut self) {
            CURRENT.set(self.0);
        }
    }
    Leave(CURRENT.replace(thread))
}
