//! Emulated mbarriers: arrivals and transaction bytes per phase, kept beside the cluster's
//! shared memory, keyed by block and address.

use super::fiber::suspend;
use super::memory::{self, split};
use super::ops::fault;
use super::schedule::Wait;
use super::thread::{with_current, Thread};

/// One barrier object's state.
pub struct Mbarrier {
    rank: u32,
    addr: u32,
    arrivals: u32,
    pending: u32,
    tx: i64,
    /// Phases completed so far.
    pub completed: u32,
}

impl Mbarrier {
    fn complete_if_done(&mut self) {
        if self.pending == 0 && self.tx == 0 {
            self.completed += 1;
            self.pending = self.arrivals;
        }
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
        let state = Mbarrier { rank, addr, arrivals, pending: arrivals, tx: 0, completed: 0 };
        thread.cluster().mbarriers.borrow_mut().push(state);
    })
}

/// `mbarrier.arrive.expect_tx`.
pub fn arrive_expect_tx(addr: u32, bytes: u32) {
    with_current(|thread| {
        let i = index(thread, addr);
        let mut barriers = thread.cluster().mbarriers.borrow_mut();
        let barrier = &mut barriers[i];
        if barrier.pending == 0 {
            fault(format_args!("more arrivals at an mbarrier than its init count ({})", barrier.arrivals));
        }
        barrier.pending -= 1;
        barrier.tx += i64::from(bytes);
        barrier.complete_if_done();
    })
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

/// Records that `thread` has seen barrier `i`'s first `completed` phases complete.
fn observe(thread: &Thread, i: usize, completed: u32) {
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
    let (i, phase) = with_current(|thread| {
        if split(dst, thread.rank).0 != split(barrier, thread.rank).0 {
            fault(format_args!("cp.async.bulk whose destination and mbarrier are in different blocks"));
        }
        let i = index(thread, barrier);
        (i, thread.cluster().mbarriers.borrow()[i].completed)
    });
    memory::bulk_copy(dst, src, bytes as usize, i as u32, phase);
    with_current(|thread| {
        let mut barriers = thread.cluster().mbarriers.borrow_mut();
        barriers[i].tx -= i64::from(bytes);
        barriers[i].complete_if_done();
    })
}
