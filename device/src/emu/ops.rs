//! What [`crate::arch`] calls off the GPU: registers, barriers, shuffles, global accesses.

use super::fiber::suspend;
use super::memory::STATIC_BASE;
use super::schedule::{ClusterBarrier, Wait};
use super::thread::{with_current, Registers};
use core::fmt;
use core::mem::size_of;
use core::sync::atomic::{AtomicU32, Ordering};
use std::format;
use std::string::String;
use std::sync::OnceLock;
use std::time::Instant;

/// Ends the calling thread's kernel with `message`; the launch reports it with the kernel,
/// block and thread.
#[cold]
pub fn fault(message: fmt::Arguments<'_>) -> ! {
    std::panic!("{message}")
}

/// `trap` and failed device-side checks.
#[cold]
pub fn trap(what: &str) -> ! {
    fault(format_args!("{what}"))
}

/// Reads the calling thread's special registers.
pub fn registers(read: impl FnOnce(&Registers) -> u32) -> u32 {
    with_current(|thread| read(&thread.registers))
}

/// The address of the static shared array at `site` (see `arch::static_shared_address`).
pub fn static_shared_address(site: &'static u8, bytes: usize) -> u32 {
    with_current(|thread| {
        let cluster = thread.cluster();
        match cluster.registry.place(site as *const u8 as usize, bytes) {
            Ok(offset) => STATIC_BASE + offset,
            Err(message) => fault(format_args!("{message}")),
        }
    })
}

/// Nanoseconds since the first call in this process.
pub fn clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// `bar.sync`.
pub fn block_barrier() {
    with_current(|thread| suspend(thread, Wait::Block));
}

/// `bar.warp.sync mask`.
pub fn warp_barrier(mask: u32) {
    with_current(|thread| {
        check_member_mask(thread, mask);
        suspend(thread, Wait::Warp(mask));
    });
}

/// Fences: the emulator is sequentially consistent, so they order nothing further.
pub fn fence() {}

/// `barrier.cluster.arrive` (release or relaxed: the emulator orders both).
pub fn cluster_arrive() {
    with_current(|thread| {
        if thread.cluster_arrival.get().is_some() {
            fault(format_args!("barrier.cluster.arrive twice without a wait in between"));
        }
        let cluster = thread.cluster();
        let mut barrier = cluster.barrier.get();
        thread.cluster_arrival.set(Some(barrier.phase));
        barrier.arrived += 1;
        if barrier.arrived == cluster.size * cluster.threads_per_block {
            barrier = ClusterBarrier { phase: barrier.phase + 1, arrived: 0 };
        }
        cluster.barrier.set(barrier);
    });
}

/// `barrier.cluster.wait`.
pub fn cluster_wait() {
    with_current(|thread| {
        let Some(phase) = thread.cluster_arrival.take() else {
            fault(format_args!("barrier.cluster.wait without a barrier.cluster.arrive before it"));
        };
        let completed = thread.cluster().barrier.get().phase;
        if phase < completed {
            let mut epochs = thread.epochs.get();
            epochs.cluster = completed;
            thread.epochs.set(epochs);
        } else {
            suspend(thread, Wait::Cluster(phase));
        }
    });
}

/// A warp exchange: which lane each lane reads, or a vote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shuffle {
    Butterfly,
    Down,
    Up,
    Index,
    Ballot,
}

impl Shuffle {
    /// Lane `lane`'s result, from every lane's `(value, operand)`.
    pub(super) fn apply(self, operands: &[(u32, u32); 32], lane: u32, mask: u32) -> Result<u32, String> {
        let (own, operand) = operands[lane as usize];
        let source = match self {
            Shuffle::Ballot => {
                return Ok((0..32).filter(|&l| mask & (1 << l) != 0 && operands[l as usize].0 != 0).fold(0, |bits, l| bits | (1 << l)));
            }
            Shuffle::Butterfly => lane ^ (operand & 31),
            Shuffle::Down => lane + operand,
            Shuffle::Up => match lane.checked_sub(operand) {
                Some(source) => source,
                None => return Ok(own),
            },
            Shuffle::Index => operand & 31,
        };
        if source > 31 {
            Ok(own)
        } else if mask & (1 << source) == 0 {
            Err(format!("shuffle: lane {lane} reads lane {source}, which is not in the member mask {mask:#010x}"))
        } else {
            Ok(operands[source as usize].0)
        }
    }
}

/// `shfl.sync` / `vote.sync`: every lane of `mask` contributes `(value, operand)` and waits
/// for the others.
pub fn shuffle(op: Shuffle, value: u32, operand: u32, mask: u32) -> u32 {
    with_current(|thread| {
        check_member_mask(thread, mask);
        let warp = &thread.cluster().blocks[thread.rank as usize].warps[thread.warp() as usize];
        let lane = thread.registers.lane as usize;
        warp.borrow_mut().operands[lane] = (value, operand);
        suspend(thread, Wait::Collective(op, mask));
        let result = warp.borrow().results[lane];
        result
    })
}

fn check_member_mask(thread: &super::thread::Thread, mask: u32) {
    let lane = thread.registers.lane;
    let lanes = (thread.cluster().threads_per_block - thread.warp() * 32).min(32);
    if mask & (1 << lane) == 0 {
        fault(format_args!("warp-synchronous op with member mask {mask:#010x}, which leaves out the calling lane {lane}"));
    }
    if lanes < 32 && mask >> lanes != 0 {
        fault(format_args!("member mask {mask:#010x} names lanes past the end of a warp of {lanes} threads (the block is not a multiple of 32)"));
    }
}

/// Checks that `size` bytes at `ptr` lie inside a buffer passed to the kernel and are
/// aligned, then runs the access.
pub fn global_access<T, R>(ptr: *const T, size: usize, access: impl FnOnce() -> R) -> R {
    with_current(|thread| {
        let address = ptr as usize;
        if !address.is_multiple_of(size) {
            fault(format_args!("misaligned {size}-byte global access at {address:#x}"));
        }
        let inside = thread.cluster().buffers.iter().any(|&(start, bytes)| address >= start && address + size <= start + bytes);
        if !inside {
            fault(format_args!("global access of {size} bytes at {address:#x}, outside every buffer passed to the kernel"));
        }
    });
    access()
}

/// A 32-bit atomic read-modify-write of global memory; returns the old value.
///
/// # Safety
/// 1. `ptr` is aligned, valid for reads and writes, and only accessed atomically meanwhile.
pub unsafe fn atomic_update<T: Copy>(ptr: *mut T, update: impl Fn(T) -> T) -> T {
    const { assert!(size_of::<T>() == 4) };
    // SAFETY: aligned and valid (caller); `T` has the size of a `u32`.
    let word = unsafe { AtomicU32::from_ptr(ptr.cast()) };
    let bits = |v: T| unsafe { core::mem::transmute_copy::<T, u32>(&v) };
    let value = |b: u32| unsafe { core::mem::transmute_copy::<u32, T>(&b) };
    let old = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some(bits(update(value(b)))));
    value(old.unwrap_or_else(|b| b))
}
