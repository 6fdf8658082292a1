//! mbarriers: barrier objects in shared memory that count, per phase, arrivals and the bytes
//! of asynchronous copies, such as the bulk DSMEM copies of
//! [`RemoteSlice::copy_from`](crate::cluster::RemoteSlice::copy_from). Unlike `bar.sync`,
//! peers of the cluster can signal a block's mbarrier, and a thread waits for a phase, not
//! for the other threads. A [`Mailbox`] is shared words that peers fill with asynchronous
//! stores, counted by one.

use crate::arch;
use crate::cluster;
use crate::out_of_bounds;
use crate::shared::SharedSlice;

/// One thread's handle on an mbarrier of its block, with the parity of the phase it waits
/// for next.
pub struct Mbarrier {
    addr: u32,
    parity: u32,
}

/// A peer block's mbarrier, as bulk copies into that block name it.
#[derive(Clone, Copy)]
pub struct RemoteMbarrier {
    pub(crate) addr: u32,
    pub(crate) rank: u32,
}

impl Mbarrier {
    /// The mbarrier in `slot[0]`, initialised by thread 0 of the block to expect `arrivals`
    /// per phase. Every thread of the block calls it.
    ///
    /// # Safety
    /// 1. Every thread of the block passes a barrier after this call and before the mbarrier
    ///    is used by any thread but the block's thread 0 (which initialised it): a block
    ///    barrier, or a cluster barrier when peers will signal it (its arrival may be relaxed:
    ///    the init's `fence.mbarrier_init` releases it). An mbarrier used before its init is
    ///    visible is undefined.
    /// 2. `slot[0]` holds nothing else while the mbarrier is in use.
    #[inline(always)]
    pub unsafe fn new(slot: SharedSlice<u64>, arrivals: u32) -> Self {
        if slot.is_empty() {
            out_of_bounds()
        }
        if crate::thread::rank_in_block() == 0 {
            // SAFETY: `slot[0]` is 8 aligned bytes of this block's shared memory, given to
            // the barrier; the caller's barrier orders the init before any use (contract).
            unsafe { arch::mbarrier_init_shared_b64(slot.addr(), arrivals) };
            arch::fence_mbarrier_init_release_cluster();
        }
        Self { addr: slot.addr(), parity: 0 }
    }

    /// The barrier's 32-bit shared address (for TMA loads that complete on it).
    #[inline(always)]
    pub fn addr(&self) -> u32 {
        self.addr
    }

    /// One arrival that also announces `bytes` of copies into this block in this phase.
    #[inline(always)]
    pub fn arrive_expect_tx(&self, bytes: u32) {
        // SAFETY: an initialised barrier of this block (`new`).
        unsafe { arch::mbarrier_arrive_expect_tx_shared_b64(self.addr, bytes) }
    }

    /// Waits until the current phase completes (every arrival made, every announced byte
    /// arrived), then moves on to the next phase.
    #[inline(always)]
    pub fn wait(&mut self) {
        // SAFETY: as for `arrive_expect_tx`.
        while !unsafe { arch::mbarrier_try_wait_parity_shared_b64(self.addr, self.parity) } {}
        self.parity ^= 1;
    }

    /// The same mbarrier in the block of cluster rank `rank`; traps when `rank` is out of range.
    #[inline(always)]
    pub fn in_block(&self, rank: u32) -> RemoteMbarrier {
        if rank >= cluster::size() {
            out_of_bounds()
        }
        RemoteMbarrier { addr: arch::mapa_shared_cluster(self.addr, rank), rank }
    }
}

/// A block's mailbox: shared words that the cluster's blocks fill with asynchronous stores
/// ([`RemoteSlice::store_async`](crate::cluster::RemoteSlice::store_async)), counted by an
/// mbarrier, so that a block learns its peers' words have landed without a cluster barrier
/// (whose releasing arrival costs a `MEMBAR.ALL.GPU` on sm_90). Each phase: one thread of
/// the block [`expect`](Self::expect)s the words the phase brings, the senders
/// [`post`](Self::post), every reader [`wait`](Self::wait)s. Whoever reuses a word in a
/// later phase must know first that its reader is done with it (a cluster barrier after the
/// reads: its arrival may be relaxed). Clusters of two blocks or more only: `st.async`
/// faults in a cluster of one.
pub struct Mailbox {
    words: SharedSlice<u64>,
    arrived: Mbarrier,
}

impl Mailbox {
    /// The mailbox `words`, counted by the mbarrier in `slot[0]` (initialised here by thread
    /// 0). Every thread of the block calls it.
    ///
    /// # Safety
    /// 1. Every thread of the cluster passes a cluster barrier after this call and before a
    ///    block posts or waits (its arrival may be relaxed: the init's fence releases it);
    ///    only the block's thread 0, which initialised it, may [`expect`](Self::expect) before.
    /// 2. `words` and `slot[0]` hold nothing else while the mailbox is in use.
    #[inline(always)]
    pub unsafe fn new(words: SharedSlice<u64>, slot: SharedSlice<u64>) -> Self {
        // SAFETY: the caller's cluster barrier is also a barrier of this block's threads.
        Self { words, arrived: unsafe { Mbarrier::new(slot, 1) } }
    }

    /// The words, readable once [`wait`](Self::wait) returns.
    #[inline(always)]
    pub fn words(&self) -> SharedSlice<u64> {
        self.words
    }

    /// Announces that this phase brings `words` words (posted by any block, this one too).
    /// One thread of the block calls it once a phase, before or after the posts.
    #[inline(always)]
    pub fn expect(&self, words: usize) {
        self.arrived.arrive_expect_tx((words * core::mem::size_of::<u64>()) as u32);
    }

    /// Stores `word` into word `i` of block `rank`'s mailbox; traps when out of range.
    #[inline(always)]
    pub fn post(&self, rank: u32, i: usize, word: u64) {
        self.words.in_block(rank).store_async(i, word, self.arrived.in_block(rank));
    }

    /// Waits until this phase's words have all landed, then moves on to the next phase.
    #[inline(always)]
    pub fn wait(&mut self) {
        self.arrived.wait();
    }
}
