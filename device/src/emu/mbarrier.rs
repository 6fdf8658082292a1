//! Emulated mbarriers: arrivals and transaction bytes per phase, kept beside the cluster's
//! shared memory, keyed by block and address.
//!
//! A phase also carries what its arrivals release, for the race check: each arriving thread's
//! arrival count and what it had itself learned (arrivals of other threads, mbarrier phases
//! seen complete). A thread that waits for the phase acquires all of it, so that accesses
//! made before an arrival are ordered before the waiter's — the producer/consumer pipelines of
//! TMA and `wgmma` kernels, where no `bar.sync` orders the stages' reuse.

use super::fiber::suspend;
use super::memory::{self, split};
use super::ops::{fault, global_range};
use super::schedule::Wait;
use super::thread::{with_current, Thread};
use std::vec::Vec;

/// What the arrivals of one phase release: per thread, arrivals known; per mbarrier, phases
/// seen complete.
#[derive(Clone, Default)]
struct Release {
    arrivals: Vec<u32>,
    phases: Vec<u32>,
}

/// `into[i] = max(into[i], from[i])`, growing `into` as needed.
fn join(into: &mut Vec<u32>, from: &[u32]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, &b) in into.iter_mut().zip(from) {
        *a = (*a).max(b);
    }
}

/// One barrier object's state.
pub struct Mbarrier {
    rank: u32,
    addr: u32,
    arrivals: u32,
    pending: u32,
    tx: i64,
    /// Phases completed so far.
    pub completed: u32,
    /// What the current phase's arrivals release so far.
    pending_release: Release,
    /// What each completed phase released, by phase number.
    released: Vec<Release>,
}

impl Mbarrier {
    fn complete_if_done(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = self.arrivals;
            self.released.push(core::mem::take(&mut self.pending_release));
        }
    }

    /// One arrival of `thread`: counts it and adds what it releases to the phase.
    fn arrive(&mut self, thread: &Thread) {
        if self.pending == 0 {
            fault(format_args!("more arrivals at an mbarrier than its init count ({})", self.arrivals));
        }
        let count = thread.arrivals.get() + 1;
        thread.arrivals.set(count);
        let release = &mut self.pending_release;
        join(&mut release.arrivals, &thread.known_arrivals.borrow());
        join(&mut release.phases, &thread.mbarrier_phases.borrow());
        let id = thread.id as usize;
        if release.arrivals.len() <= id {
            release.arrivals.resize(id + 1, 0);
        }
        release.arrivals[id] = release.arrivals[id].max(count);
        self.pending -= 1;
    }
}

/// The index of the initialised barrier at `addr` (of this thread's block, or mapped).
fn index(thread: &Thread, addr: u32) -> usize {
    let (rank, addr) = split(addr, thread.rank);
    let barriers = thread.cluster().mbarriers.borrow();
    // The latest `init` of the address: a re-initialised barrier is a new one.
    match barriers.iter().rposition(|b| b.rank == rank && b.addr == addr) {
        Some(i) => i,
        None => fault(format_args!("mbarrier at {addr:#x} of block rank {rank} used before mbarrier.init")),
    }
}

/// `mbarrier.init`. A re-initialised address becomes a new barrier, so that the phases threads
/// saw on the old one order nothing on it.
pub fn init(addr: u32, arrivals: u32) {
    with_current(|thread| {
        let (rank, addr) = split(addr, thread.rank);
        let state = Mbarrier {
            rank,
            addr,
            arrivals,
            pending: arrivals,
            tx: 0,
            completed: 0,
            pending_release: Release::default(),
            released: Vec::new(),
        };
        thread.cluster().mbarriers.borrow_mut().push(state);
    })
}

/// `mbarrier.arrive.expect_tx`.
pub fn arrive_expect_tx(addr: u32, bytes: u32) {
    with_current(|thread| {
        let i = index(thread, addr);
        let mut barriers = thread.cluster().mbarriers.borrow_mut();
        let barrier = &mut barriers[i];
        barrier.arrive(thread);
        barrier.tx += i64::from(bytes);
        barrier.complete_if_done();
    })
}

/// A rendezvous of `threads` (a warpgroup at `wgmma.wait_group`) that orders each one's
/// earlier accesses before all of them: each makes an arrival, then all learn what all knew.
pub fn share_knowledge(threads: &[&Thread]) {
    let mut shared = Release::default();
    for thread in threads {
        thread.arrivals.set(thread.arrivals.get() + 1);
        join(&mut shared.arrivals, &thread.known_arrivals.borrow());
        join(&mut shared.phases, &thread.mbarrier_phases.borrow());
        let id = thread.id as usize;
        if shared.arrivals.len() <= id {
            shared.arrivals.resize(id + 1, 0);
        }
        shared.arrivals[id] = thread.arrivals.get();
    }
    for thread in threads {
        join(&mut thread.known_arrivals.borrow_mut(), &shared.arrivals);
        join(&mut thread.mbarrier_phases.borrow_mut(), &shared.phases);
    }
}

/// `mbarrier.arrive`: one arrival, no transaction bytes.
pub fn arrive(addr: u32) {
    arrive_expect_tx(addr, 0)
}

/// `mbarrier.try_wait.parity`: on the emulator, waits (suspends) until the phase of parity
/// `parity` has completed, then reports it done.
pub fn try_wait(addr: u32, parity: u32) -> bool {
    with_current(|thread| {
        let i = index(thread, addr);
        let mut completed = thread.cluster().mbarriers.borrow()[i].completed;
        if completed & 1 == parity & 1 {
            suspend(thread, Wait::Mbarrier(i as u32, parity & 1));
            // The phase waited for, not any later one completed meanwhile.
            completed += 1;
        }
        observe(thread, i, completed);
        true
    })
}

/// Records that `thread` has seen barrier `i`'s first `completed` phases complete, and
/// acquires what the last of them released.
fn observe(thread: &Thread, i: usize, completed: u32) {
    if let Some(phase) = completed.checked_sub(1) {
        let barriers = thread.cluster().mbarriers.borrow();
        let release = &barriers[i].released[phase as usize];
        join(&mut thread.known_arrivals.borrow_mut(), &release.arrivals);
        join(&mut thread.mbarrier_phases.borrow_mut(), &release.phases);
    }
    let mut phases = thread.mbarrier_phases.borrow_mut();
    if phases.len() <= i {
        phases.resize(i + 1, 0);
    }
    phases[i] = phases[i].max(completed);
}

/// `cp.async.bulk...mbarrier::complete_tx`: the copy, then its bytes completed on `barrier`.
pub fn bulk_copy(dst: u32, src: u32, bytes: u32, barrier: u32) {
    if !bytes.is_multiple_of(16) {
        fault(format_args!("cp.async.bulk of {bytes} bytes: the size must be a multiple of 16"));
    }
    complete_tx(dst, bytes, barrier, |i, phase| memory::bulk_copy(dst, src, bytes as usize, i, phase));
}

/// `st.async...mbarrier::complete_tx.b64`: `value` written to `dst` (its alignment checked
/// as every shared access's), then its 8 bytes completed on `barrier`. A fault in a cluster
/// of one block, as on the GPU (compute-sanitizer: "Cluster needs to have at least 2 blocks").
pub fn store_async(dst: u32, value: u64, barrier: u32) {
    if with_current(|thread| thread.cluster().size) < 2 {
        fault(format_args!("st.async in a cluster of 1 block: the GPU needs a cluster of at least 2"));
    }
    complete_tx(dst, 8, barrier, |i, phase| memory::async_write(dst, &value.to_le_bytes(), i, phase));
}

/// `cp.async.bulk.shared::cluster.global...mbarrier::complete_tx`: the global bytes read at
/// issue (checked to lie in a kernel buffer), written to `dst`, then completed on `barrier`.
///
/// # Safety
/// 1. As for `arch::cp_async_bulk_shared_cluster_global`: `src .. src + bytes` is readable.
pub unsafe fn bulk_load(dst: u32, src: *const u8, bytes: u32, barrier: u32) {
    if !bytes.is_multiple_of(16) || !(src as usize).is_multiple_of(16) || !dst.is_multiple_of(16) {
        fault(format_args!("cp.async.bulk of {bytes} bytes from {src:p} to {dst:#x}: size and both addresses must be multiples of 16"));
    }
    let data = global_range(src, bytes as usize, || {
        // SAFETY: inside a kernel buffer (checked by `global_range`) and readable (caller).
        unsafe { core::slice::from_raw_parts(src, bytes as usize) }.to_vec()
    });
    complete_tx(dst, bytes, barrier, |i, phase| memory::async_write(dst, &data, i, phase));
}

/// An asynchronous copy of `bytes` to `dst`: `write(mbarrier index, phase)` does its writes,
/// then its bytes complete on `barrier`.
pub fn complete_tx(dst: u32, bytes: u32, barrier: u32, write: impl FnOnce(u32, u32)) {
    let (i, phase) = with_current(|thread| {
        if split(dst, thread.rank).0 != split(barrier, thread.rank).0 {
            fault(format_args!("asynchronous copy whose destination and mbarrier are in different blocks"));
        }
        let i = index(thread, barrier);
        (i, thread.cluster().mbarriers.borrow()[i].completed)
    });
    write(i as u32, phase);
    with_current(|thread| {
        let mut barriers = thread.cluster().mbarriers.borrow_mut();
        barriers[i].tx -= i64::from(bytes);
        barriers[i].complete_if_done();
    })
}
