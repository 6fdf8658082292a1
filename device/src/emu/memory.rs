//! Emulated shared memory: per-block windows behind 32-bit shared addresses, bounds,
//! alignment and DSMEM checks, and the race check.
//!
//! An address holds a window and an offset, plus, once mapped by `mapa`, the cluster rank of
//! the block it points into: `rank + 1` in bits 27-31, the window in bits 24-26 (1 static
//! arrays, 2 dynamic memory), the byte offset below.

use super::ops::fault;
use super::thread::{with_current, Epochs, Thread};
use core::mem::size_of;
use std::vec::Vec;

/// Where static shared arrays start.
pub const STATIC_BASE: u32 = 1 << 24;
/// Where the launch's dynamic shared memory starts.
pub const DYNAMIC_BASE: u32 = 2 << 24;
const WINDOW_MASK: u32 = 0x7 << 24;
const RANK_SHIFT: u32 = 27;
const OFFSET_MASK: u32 = (1 << 24) - 1;

/// Which form of the instruction: `.shared::cta` or `.shared::cluster`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Space {
    Block,
    Cluster,
}

/// `mapa`: the distributed-shared address of `addr` in the block of rank `rank`.
pub fn mapa(addr: u32, rank: u32) -> u32 {
    with_current(|thread| {
        let size = thread.cluster().size;
        if rank >= size {
            fault(format_args!("mapa to cluster rank {rank}, but the cluster has {size} blocks"));
        }
        (addr & !(0x1f << RANK_SHIFT)) | ((rank + 1) << RANK_SHIFT)
    })
}

/// One thread's access, as the race check records it, with the mbarrier arrivals the thread
/// had made before it (`arrivals`). A bulk copy's writes carry `ASYNC | mbarrier` as their
/// thread and the barrier's phase in `epochs.warp`: they are ordered before a thread once it
/// has waited for that phase.
#[derive(Clone, Copy, Debug)]
struct Stamp {
    thread: u32,
    epochs: Epochs,
    arrivals: u32,
}

const NOBODY: u32 = u32::MAX;
const ASYNC: u32 = 1 << 31;

impl Stamp {
    const NONE: Stamp = Stamp { thread: NOBODY, epochs: Epochs { warp: 0, block: 0, cluster: 0 }, arrivals: 0 };

    fn of(thread: &Thread) -> Stamp {
        let mut epochs = thread.epochs.get();
        // Writes after an arrive are not released by that arrive's barrier.
        if thread.cluster_arrival.get().is_some() {
            epochs.cluster += 1;
        }
        Stamp { thread: thread.id, epochs, arrivals: thread.arrivals.get() }
    }

    /// True when this access is ordered before everything `thread` does now.
    fn ordered_before(&self, thread: &Thread, threads_per_block: u32) -> bool {
        if self.thread == NOBODY || self.thread == thread.id {
            return true;
        }
        let now = thread.epochs.get();
        if self.thread & ASYNC != 0 {
            let waited = thread.mbarrier_phases.borrow().get((self.thread & !ASYNC) as usize).copied().unwrap_or(0);
            return waited > self.epochs.warp || now.cluster > self.epochs.cluster;
        }
        // An mbarrier arrival of the accessing thread after the access, whose phase this
        // thread has waited for (directly or through other threads' arrivals).
        if thread.known_arrivals.borrow().get(self.thread as usize).is_some_and(|&known| known > self.arrivals) {
            return true;
        }
        let same_block = self.thread / threads_per_block == thread.id / threads_per_block;
        let same_warp = same_block && (self.thread % threads_per_block) / 32 == thread.index / 32;
        (same_warp && now.warp > self.epochs.warp)
            || (same_block && now.block > self.epochs.block)
            || now.cluster > self.epochs.cluster
    }
}

/// The race check's record of one byte: its last write and its last two readers since.
#[derive(Clone, Copy, Debug)]
struct Shadow {
    write: Stamp,
    reads: [Stamp; 2],
}

impl Shadow {
    const CLEAN: Shadow = Shadow { write: Stamp::NONE, reads: [Stamp::NONE; 2] };
}

/// One window of a block's shared memory, with its shadow.
#[derive(Default)]
struct Window {
    bytes: Vec<u8>,
    shadow: Vec<Shadow>,
}

impl Window {
    /// Grows to `len` bytes of poison (`0xff`).
    fn grow(&mut self, len: usize) {
        if len > self.bytes.len() {
            self.bytes.resize(len, 0xff);
            self.shadow.resize(len, Shadow::CLEAN);
        }
    }
}

/// A block's shared memory: static arrays and dynamic memory.
pub struct BlockMemory {
    statics: Window,
    dynamic: Window,
}

impl BlockMemory {
    pub fn new(dynamic_bytes: u32) -> Self {
        let mut dynamic = Window::default();
        dynamic.grow(dynamic_bytes as usize);
        Self { statics: Window::default(), dynamic }
    }

    /// Makes room for static arrays up to `len` bytes.
    pub fn grow_static(&mut self, len: u32) {
        self.statics.grow(len as usize);
    }
}

/// What one access does to memory and the shadow.
#[derive(Clone, Copy)]
enum Access {
    Read,
    Write,
    /// Atomics are ordered among themselves; they are not checked against plain accesses.
    Atomic,
    /// A bulk copy's writes, checked from the issuing thread and recorded with this stamp.
    Copy(Stamp),
}

/// Checks an access of `size` bytes at `addr` and runs `f` on the bytes.
fn access<R>(addr: u32, size: usize, space: Space, kind: Access, f: impl FnOnce(&mut [u8]) -> R) -> R {
    with_current(|thread| {
        let cluster = thread.cluster();
        let rank = match (addr >> RANK_SHIFT, space) {
            (0, _) => thread.rank,
            (_, Space::Block) => fault(format_args!(
                "`ld/st.shared` at {addr:#x}, a distributed-shared address from `mapa`: use the `::cluster` form (a `RemoteSlice`)"
            )),
            (mapped, Space::Cluster) => mapped - 1,
        };
        let block = &cluster.blocks[rank as usize];
        if rank != thread.rank {
            if thread.epochs.get().cluster == 0 {
                fault(format_args!(
                    "shared-memory access to block rank {rank} of the cluster before any cluster barrier: that block may not have started, so its shared memory may not exist yet; call cluster::sync() (or arrive, then wait) first"
                ));
            }
            match kind {
                // Counted by the destination's mbarrier: the block may exit once the phase
                // completes (`schedule::check_exit`).
                Access::Copy(stamp) => block.record_async_write(stamp.thread & !ASYNC, stamp.epochs.warp, thread.id),
                _ => {
                    let epoch = Stamp::of(thread).epochs.cluster;
                    if block.remote_access.get().is_none_or(|(latest, _)| epoch >= latest) {
                        block.remote_access.set(Some((epoch, thread.id)));
                    }
                }
            }
        }
        if block.exited() {
            fault(format_args!("shared-memory access to block rank {rank} of the cluster, which has exited: keep blocks alive with a cluster barrier until peers are done"));
        }
        let offset = (addr & OFFSET_MASK) as usize;
        if !(addr as usize).is_multiple_of(size.min(16)) {
            fault(format_args!("misaligned {size}-byte shared access at {addr:#x}"));
        }
        let mut memory = block.memory.borrow_mut();
        let window = match addr & WINDOW_MASK {
            STATIC_BASE => {
                memory.grow_static(cluster.registry.static_bytes());
                &mut memory.statics
            }
            DYNAMIC_BASE => &mut memory.dynamic,
            _ => fault(format_args!("{size}-byte shared access at {addr:#x}, which is not a shared-memory address")),
        };
        if offset + size > window.bytes.len() {
            let what = if addr & WINDOW_MASK == STATIC_BASE { "static shared arrays" } else { "dynamic shared memory" };
            fault(format_args!(
                "out-of-bounds shared access: {size} bytes at offset {offset} of {what} ({} bytes) of block rank {rank}",
                window.bytes.len()
            ));
        }
        if !matches!(kind, Access::Atomic) {
            check_races(thread, cluster.threads_per_block, &mut window.shadow[offset..offset + size], kind, offset, rank);
        }
        f(&mut window.bytes[offset..offset + size])
    })
}

fn check_races(thread: &Thread, threads_per_block: u32, shadow: &mut [Shadow], kind: Access, offset: usize, rank: u32) {
    let me = match kind {
        Access::Copy(stamp) => stamp,
        _ => Stamp::of(thread),
    };
    for byte in shadow {
        let conflict = match kind {
            Access::Read => (!byte.write.ordered_before(thread, threads_per_block)).then_some(("reads", "written", byte.write)),
            _ => {
                let unordered_read = byte.reads.iter().find(|r| !r.ordered_before(thread, threads_per_block));
                if !byte.write.ordered_before(thread, threads_per_block) {
                    Some(("writes", "written", byte.write))
                } else {
                    unordered_read.map(|r| ("writes", "read", *r))
                }
            }
        };
        if let Some((verb, other, stamp)) = conflict {
            let cluster = thread.cluster();
            if stamp.thread & ASYNC != 0 {
                fault(format_args!(
                    "shared-memory race: this thread {verb} byte {offset} of block rank {rank}'s shared memory, written by a bulk copy whose mbarrier phase it has not waited for"
                ));
            }
            let (block, other_thread) = cluster.locate(stamp.thread);
            fault(format_args!(
                "shared-memory race: this thread {verb} byte {offset} of block rank {rank}'s shared memory, {other} by thread {other_thread} of block {block} with no barrier between them"
            ));
        }
        match kind {
            Access::Read => {
                if byte.reads[0].thread != me.thread {
                    byte.reads[1] = byte.reads[0];
                }
                byte.reads[0] = me;
            }
            _ => *byte = Shadow { write: me, reads: [Stamp::NONE; 2] },
        }
    }
}

/// `ld.shared` (`Space::Block`) or `ld.shared::cluster` of a `T`.
pub fn load<T: Copy>(addr: u32, space: Space) -> T {
    access(addr, size_of::<T>(), space, Access::Read, |bytes| {
        // SAFETY: `bytes` holds `size_of::<T>()` bytes; shared words are plain bits.
        unsafe { bytes.as_ptr().cast::<T>().read_unaligned() }
    })
}

/// `st.shared` or `st.shared::cluster` of a `T`.
pub fn store<T: Copy>(addr: u32, value: T, space: Space) {
    access(addr, size_of::<T>(), space, Access::Write, |bytes| {
        // SAFETY: as for `load`.
        unsafe { bytes.as_mut_ptr().cast::<T>().write_unaligned(value) }
    })
}

/// `atom.shared`: replaces the value with `update(old)`, returns `old`.
pub fn atomic<T: Copy>(addr: u32, update: impl FnOnce(T) -> T) -> T {
    access(addr, size_of::<T>(), Space::Block, Access::Atomic, |bytes| {
        // SAFETY: as for `load`.
        unsafe {
            let old = bytes.as_ptr().cast::<T>().read_unaligned();
            bytes.as_mut_ptr().cast::<T>().write_unaligned(update(old));
            old
        }
    })
}

/// `cp.async.bulk` of `bytes` from this block's `src` to the distributed-shared `dst`, as the
/// emulator runs it: at once, its writes ordered before the threads that wait for `phase` of
/// the destination's mbarrier `index`.
pub fn bulk_copy(dst: u32, src: u32, bytes: usize, index: u32, phase: u32) {
    let data: Vec<u8> = access(src, bytes, Space::Block, Access::Read, |from| from.to_vec());
    async_write(dst, &data, index, phase);
}

/// An asynchronous copy's writes of `data` at the (distributed-)shared `dst`, checked from the
/// issuing thread and ordered before the threads that wait for `phase` of mbarrier `index`.
pub fn async_write(dst: u32, data: &[u8], index: u32, phase: u32) {
    let cluster = with_current(|thread| Stamp::of(thread).epochs.cluster);
    let stamp = Stamp { thread: ASYNC | index, epochs: Epochs { warp: phase, block: 0, cluster }, arrivals: 0 };
    access(dst, data.len(), Space::Cluster, Access::Copy(stamp), |to| to.copy_from_slice(data));
}

/// The window bits (static or dynamic memory) of a `.shared::cta` address: what a `wgmma`
/// matrix descriptor's 18-bit address drops, kept by the emulator in reserved descriptor bits.
pub fn window_of(addr: u32) -> u32 {
    (addr & WINDOW_MASK) >> 24
}

/// The cluster-rank bits of a `.shared::cluster` address from [`mapa`] (none in a
/// `.shared::cta` one).
pub fn rank_bits(addr: u32) -> u32 {
    addr & (0x1f << RANK_SHIFT)
}

/// The `.shared::cta` address of byte `offset` in window `window` (see [`window_of`]).
pub fn in_window(window: u32, offset: u32) -> u32 {
    (window << 24) | (offset & OFFSET_MASK)
}

/// The block rank an address points into (`own` for a `.shared::cta` address) and the
/// address within that block.
pub fn split(addr: u32, own: u32) -> (u32, u32) {
    match addr >> RANK_SHIFT {
        0 => (own, addr),
        mapped => (mapped - 1, addr & !(0x1f << RANK_SHIFT)),
    }
}
