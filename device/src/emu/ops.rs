//! What [`crate::arch`] calls off the GPU: registers, barriers, shuffles, global accesses.

use super::fiber::suspend;
use super::memory::{self, Space, STATIC_BASE};
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

/// `wgmma.wait_group`: a rendezvous of the calling thread's warpgroup (the `wgmma`s ran at
/// issue), after which each thread's earlier shared-memory accesses, its `wgmma` operand reads
/// included, are ordered before the mbarrier arrivals of every thread of the warpgroup.
pub fn warpgroup_wait() {
    with_current(|thread| {
        let threads = thread.cluster().threads_per_block;
        if !threads.is_multiple_of(128) {
            fault(format_args!("wgmma.wait_group in a block of {threads} threads: warpgroups need whole multiples of 128"));
        }
        suspend(thread, Wait::Warpgroup);
    });
}

/// `bar.sync id, 128` of a warpgroup's own barrier (`Warpgroup::sync`): a rendezvous of the
/// warpgroup that orders its threads' memory accesses, as [`warpgroup_wait`]'s.
pub fn warpgroup_barrier(id: u32, threads: u32) {
    with_current(|thread| {
        let r = &thread.registers;
        let warpgroup = (r.tid.x + r.ntid.x * (r.tid.y + r.ntid.y * r.tid.z)) / 128;
        if threads != 128 || id != 1 + warpgroup {
            fault(format_args!("bar.sync {id}, {threads}: the emulator models named barriers only as a warpgroup's own (id 1 + its index, 128 threads)"));
        }
    });
    warpgroup_wait();
}

/// Fences: the emulator is sequentially consistent, so they order nothing further.
pub fn fence() {}

/// `ld.acquire` of `N` global words (1 or 4); the thread remembers what it read, so that a
/// spin on them that can never end is reported naming the words (see [`sleep`]).
///
/// # Safety
/// 1. `ptr` is aligned and valid for reads, and only accessed atomically meanwhile.
pub unsafe fn acquire_load<const N: usize>(ptr: *const [u32; N]) -> [u32; N] {
    const { assert!(N <= 4) };
    // SAFETY: aligned and valid (caller).
    let values = core::array::from_fn(|i| unsafe { AtomicU32::from_ptr(ptr.cast::<u32>().add(i).cast_mut()) }.load(Ordering::Acquire));
    let mut read = [0; 4];
    read[..N].copy_from_slice(&values);
    with_current(|thread| thread.spin.set(Some(Spin { address: ptr as u64, words: N as u32, read })));
    values
}

/// Global words a thread read with `ld.acquire`: what it spins on when it sleeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spin {
    pub address: u64,
    pub words: u32,
    pub read: [u32; 4],
}

/// `nanosleep`: yields to the launch's other threads. A round of the scheduler in which every
/// thread still running either waits at a barrier that cannot complete or sleeps again having
/// read the same value of the same word as before is a deadlock.
pub fn sleep() {
    with_current(|thread| suspend(thread, Wait::Sleep));
}

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
            Shuffle::Down => lane + (operand & 31),
            Shuffle::Up => match lane.checked_sub(operand & 31) {
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

/// Which 16-bit float a tensor-core instruction reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HalfKind {
    F16,
    Bf16,
}

/// A tensor-core warp collective: all 32 lanes take part, each giving up to 10 words of
/// registers and getting 4 back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matrix {
    /// `mma.sync.m16n8k16.row.col.f32`: A (words 0-3), B (4-5), C (6-9, f32 bits).
    Mma(HalfKind),
    /// `ldmatrix.m8n8.b16` of `count` matrices: words 0-3 are the row the lane addressed.
    Ldmatrix { count: u32, trans: bool },
}

impl Matrix {
    /// Every lane's result from every lane's operands, per the fragment layouts of PTX ISA
    /// §9.7.14.5.8 (mma) and §9.7.14.5.15 (ldmatrix): lane `l` is in group `l / 4` with
    /// index `l % 4` in it, and the lower half of a 32-bit register is the lower column.
    pub(super) fn apply(self, operands: &[[u32; 10]; 32]) -> [[u32; 4]; 32] {
        let half = |word: u32, h: usize| (word >> (16 * h)) as u16;
        let mut results = [[0; 4]; 32];
        match self {
            Matrix::Ldmatrix { count, trans } => {
                for (lane, result) in results.iter_mut().enumerate() {
                    let (group, index) = (lane / 4, lane % 4);
                    for j in 0..count as usize {
                        let row = |r: usize| &operands[8 * j + r][..4];
                        result[j] = if trans {
                            // Column `group` of stored rows 2·index and 2·index + 1.
                            let element = |r: usize| half(row(r)[group / 2], group % 2) as u32;
                            element(2 * index) | element(2 * index + 1) << 16
                        } else {
                            row(group)[index]
                        };
                    }
                }
            }
            Matrix::Mma(kind) => {
                let value = |bits: u16| match kind {
                    HalfKind::F16 => crate::f16::from_bits(bits).to_f64(),
                    HalfKind::Bf16 => crate::bf16::from_bits(bits).to_f64(),
                };
                let (mut a, mut b, mut d) = ([[0.0; 16]; 16], [[0.0; 8]; 16], [[0.0; 8]; 16]);
                for (lane, words) in operands.iter().enumerate() {
                    let (group, index) = (lane / 4, lane % 4);
                    for h in 0..2 {
                        for r in 0..4 {
                            a[group + 8 * (r % 2)][2 * index + 8 * (r / 2) + h] = value(half(words[r], h));
                        }
                        for r in 0..2 {
                            b[2 * index + 8 * r + h][group] = value(half(words[4 + r], h));
                        }
                    }
                    for i in 0..4 {
                        d[group + 8 * (i / 2)][2 * index + i % 2] = f32::from_bits(words[6 + i]) as f64;
                    }
                }
                // Products of 16-bit floats are exact in f64, and so nearly is their sum: one
                // rounding, to f32, at the end.
                for (lane, result) in results.iter_mut().enumerate() {
                    let (group, index) = (lane / 4, lane % 4);
                    for (i, word) in result.iter_mut().enumerate() {
                        let (row, col) = (group + 8 * (i / 2), 2 * index + i % 2);
                        let sum = (0..16).fold(d[row][col], |acc, k| acc + a[row][k] * b[k][col]);
                        *word = (sum as f32).to_bits();
                    }
                }
            }
        }
        results
    }
}

/// Lane's part of a [`Matrix`] collective: deposits `words`, waits for the whole warp, and
/// returns its 4 result words.
fn matrix(op: Matrix, words: [u32; 10]) -> [u32; 4] {
    with_current(|thread| {
        check_member_mask(thread, u32::MAX);
        let warp = &thread.cluster().blocks[thread.rank as usize].warps[thread.warp() as usize];
        let lane = thread.registers.lane as usize;
        warp.borrow_mut().matrix_operands[lane] = words;
        suspend(thread, Wait::Matrix(op));
        let result = warp.borrow().matrix_results[lane];
        result
    })
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`: a warp collective.
pub fn mma_m16n8k16(kind: HalfKind, a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let c = c.map(f32::to_bits);
    let words = [a[0], a[1], a[2], a[3], b[0], b[1], c[0], c[1], c[2], c[3]];
    matrix(Matrix::Mma(kind), words).map(f32::from_bits)
}

/// `ldmatrix.sync.aligned.m8n8.x{count}[.trans].shared.b16`: lanes `0 .. 8 count` each load
/// their row (16 bytes, an ordinary shared read, race-checked), then the warp exchanges them.
pub fn ldmatrix(count: u32, trans: bool, row_addr: u32) -> [u32; 4] {
    let lane = registers(|r| r.lane);
    let row: [u32; 4] = if lane < 8 * count { memory::load(row_addr, Space::Block) } else { [0; 4] };
    let mut words = [0; 10];
    words[..4].copy_from_slice(&row);
    matrix(Matrix::Ldmatrix { count, trans }, words)
}

/// `cp.async.cg.shared.global` of 16 bytes, zero-filled past `src_size`: copied at issue
/// (the emulator has no copies in flight, so a missing `cp.async.wait_group` goes unseen).
///
/// # Safety
/// 1. As `arch::cp_async_cg_shared_global_16`'s.
pub unsafe fn cp_async_16(dst: u32, src: *const [u32; 4], src_size: u32) {
    if src_size > 16 || !(src as usize).is_multiple_of(16) {
        fault(format_args!("cp.async of {src_size} bytes from {src:p}: the source must be 16-byte aligned and at most 16 bytes"));
    }
    let mut bytes = [0u8; 16];
    if src_size > 0 {
        let src = src.cast::<u8>();
        // Both ends of the source inside one buffer; `global_access` checks each.
        global_access(src, 1, || ());
        // SAFETY: the caller's contract: `src_size` readable bytes.
        global_access(unsafe { src.add(src_size as usize - 1) }, 1, || ());
        // SAFETY: as above.
        unsafe { core::ptr::copy_nonoverlapping(src, bytes.as_mut_ptr(), src_size as usize) };
    }
    // SAFETY: `[u8; 16]` and `[u32; 4]` are 16 bytes of plain data.
    memory::store::<[u32; 4]>(dst, unsafe { core::mem::transmute::<[u8; 16], [u32; 4]>(bytes) }, Space::Block);
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
    if !(ptr as usize).is_multiple_of(size) {
        fault(format_args!("misaligned {size}-byte global access at {:#x}", ptr as usize));
    }
    global_range(ptr, size, access)
}

/// Checks that the `size` bytes at `ptr` lie inside a buffer passed to the kernel, then runs
/// the access (a bulk copy's source, whose alignment its caller checks).
pub fn global_range<T, R>(ptr: *const T, size: usize, access: impl FnOnce() -> R) -> R {
    with_current(|thread| {
        let address = ptr as usize;
        let inside = thread.cluster().buffers.iter().any(|&(start, bytes, _)| {
            let (start, end) = (start as usize, start as usize + bytes);
            address >= start && address + size <= end
        });
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
    // SAFETY: `T` is a 4-byte plain value (f32, u32 or i32), so every bit pattern converts.
    let bits = |v: T| unsafe { core::mem::transmute_copy::<T, u32>(&v) };
    // SAFETY: as above.
    let value = |b: u32| unsafe { core::mem::transmute_copy::<u32, T>(&b) };
    let old = word.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| Some(bits(update(value(b)))));
    value(old.unwrap_or_else(|b| b))
}

#[cfg(test)]
mod tests {
    use super::Shuffle;

    /// Lane `l` holds value `100 + l` and operand `operand`.
    fn operands(operand: u32) -> [(u32, u32); 32] {
        core::array::from_fn(|l| (100 + l as u32, operand))
    }

    #[test]
    fn shuffle_offsets_use_their_low_five_bits_as_ptx_does() {
        let full = u32::MAX;
        assert_eq!(Shuffle::Down.apply(&operands(33), 3, full), Ok(104));
        assert_eq!(Shuffle::Up.apply(&operands(33), 3, full), Ok(102));
        assert_eq!(Shuffle::Down.apply(&operands(u32::MAX), 0, full), Ok(131));
        assert_eq!(Shuffle::Down.apply(&operands(1), 31, full), Ok(131));
        assert_eq!(Shuffle::Up.apply(&operands(4), 2, full), Ok(102));
        assert_eq!(Shuffle::Butterfly.apply(&operands(1), 6, full), Ok(107));
    }

    #[test]
    fn reading_a_lane_outside_the_mask_is_an_error() {
        let message = Shuffle::Index.apply(&operands(5), 0, 0b11).unwrap_err();
        assert!(message.contains("lane 5"), "{message}");
    }
}
