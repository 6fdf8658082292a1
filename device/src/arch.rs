//! One `#[inline(always)]` function per PTX instruction or special register, named after it.
//!
//! This is the bottom layer: every higher module (`warp`, `block`, `shared`, `cluster`, ...)
//! is built from these, and users may build their own primitives from them too. Shared-memory
//! addresses are 32-bit addresses in the `.shared` window (what `mov.u32 r, sym;` and `mapa`
//! produce), so that loads and stores compile to `LDS`/`STS`, not generic `LD`/`ST`.
//!
//! Off the GPU each function runs on the CPU emulator ([`crate::emu`]) instead: this is the
//! one seam between the two, so everything above it is the same code on both.
//!
//! Reference: PTX ISA 8.x, <https://docs.nvidia.com/cuda/parallel-thread-execution/>.

#[cfg(not(target_arch = "nvptx64"))]
use crate::emu;

/// `$gpu` (inline PTX) on the GPU, `$emulator` elsewhere.
macro_rules! gpu_or_emulator {
    (gpu: $gpu:expr, emulator: $emulator:expr $(,)?) => {{
        #[cfg(target_arch = "nvptx64")]
        let result = $gpu;
        #[cfg(not(target_arch = "nvptx64"))]
        let result = $emulator;
        result
    }};
}

/// One PTX instruction with `asm!` operands; its outputs are returned as a value.
#[cfg(target_arch = "nvptx64")]
macro_rules! ptx {
    ($($asm:tt)*) => { core::arch::asm!($($asm)*) };
}

// --- Special registers (PTX ISA §10) ---------------------------------------------------------

macro_rules! special_register_u32 {
    ($($(#[$doc:meta])* $name:ident => $reg:literal, $emulated:expr;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> u32 {
            gpu_or_emulator! {
                gpu: {
                    let value: u32;
                    // SAFETY: reading a special register has no side effects.
                    unsafe { ptx!(concat!("mov.u32 {v}, ", $reg, ";"), v = out(reg32) value, options(pure, nomem, nostack)) };
                    value
                },
                emulator: emu::registers($emulated),
            }
        }
    )*};
}

special_register_u32! {
    /// `%tid.x`: the thread's index in its block.
    tid_x => "%tid.x", |r: &emu::Registers| r.tid.x;
    /// `%tid.y`.
    tid_y => "%tid.y", |r: &emu::Registers| r.tid.y;
    /// `%tid.z`.
    tid_z => "%tid.z", |r: &emu::Registers| r.tid.z;
    /// `%ntid.x`: the block's extent.
    ntid_x => "%ntid.x", |r: &emu::Registers| r.ntid.x;
    /// `%ntid.y`.
    ntid_y => "%ntid.y", |r: &emu::Registers| r.ntid.y;
    /// `%ntid.z`.
    ntid_z => "%ntid.z", |r: &emu::Registers| r.ntid.z;
    /// `%ctaid.x`: the block's index in the grid.
    ctaid_x => "%ctaid.x", |r: &emu::Registers| r.ctaid.x;
    /// `%ctaid.y`.
    ctaid_y => "%ctaid.y", |r: &emu::Registers| r.ctaid.y;
    /// `%ctaid.z`.
    ctaid_z => "%ctaid.z", |r: &emu::Registers| r.ctaid.z;
    /// `%nctaid.x`: the grid's extent in blocks.
    nctaid_x => "%nctaid.x", |r: &emu::Registers| r.nctaid.x;
    /// `%nctaid.y`.
    nctaid_y => "%nctaid.y", |r: &emu::Registers| r.nctaid.y;
    /// `%nctaid.z`.
    nctaid_z => "%nctaid.z", |r: &emu::Registers| r.nctaid.z;
    /// `%laneid`: the thread's lane in its warp.
    laneid => "%laneid", |r: &emu::Registers| r.lane;
    /// `%dynamic_smem_size`: bytes of dynamic shared memory given to this launch.
    dynamic_smem_size => "%dynamic_smem_size", |r: &emu::Registers| r.dynamic_smem_size;
    /// `%cluster_ctarank`: the block's rank in its cluster.
    cluster_ctarank => "%cluster_ctarank", |r: &emu::Registers| r.cluster_rank;
    /// `%cluster_nctarank`: blocks in the cluster.
    cluster_nctarank => "%cluster_nctarank", |r: &emu::Registers| r.cluster_nctaid.volume() as u32;
    /// `%clusterid.x`: the cluster's index in the grid.
    clusterid_x => "%clusterid.x", |r: &emu::Registers| r.clusterid.x;
    /// `%clusterid.y`.
    clusterid_y => "%clusterid.y", |r: &emu::Registers| r.clusterid.y;
    /// `%clusterid.z`.
    clusterid_z => "%clusterid.z", |r: &emu::Registers| r.clusterid.z;
    /// `%nclusterid.x`: the grid's extent in clusters.
    nclusterid_x => "%nclusterid.x", |r: &emu::Registers| r.nclusterid.x;
    /// `%cluster_nctaid.x`: the cluster's extent in blocks.
    cluster_nctaid_x => "%cluster_nctaid.x", |r: &emu::Registers| r.cluster_nctaid.x;
    /// `%cluster_nctaid.y`.
    cluster_nctaid_y => "%cluster_nctaid.y", |r: &emu::Registers| r.cluster_nctaid.y;
    /// `%cluster_nctaid.z`.
    cluster_nctaid_z => "%cluster_nctaid.z", |r: &emu::Registers| r.cluster_nctaid.z;
    /// `%cluster_ctaid.x`: the block's index in its cluster.
    cluster_ctaid_x => "%cluster_ctaid.x", |r: &emu::Registers| r.cluster_ctaid.x;
    /// `%cluster_ctaid.y`.
    cluster_ctaid_y => "%cluster_ctaid.y", |r: &emu::Registers| r.cluster_ctaid.y;
    /// `%cluster_ctaid.z`.
    cluster_ctaid_z => "%cluster_ctaid.z", |r: &emu::Registers| r.cluster_ctaid.z;
}

// The kernel's dynamic shared memory: one module-scope symbol, sized by each launch.
#[cfg(target_arch = "nvptx64")]
core::arch::global_asm!(".extern .shared .align 16 .b8 __clusterfuse_dynamic_smem[];");

/// The 32-bit shared address where the launch's dynamic shared memory starts.
#[inline(always)]
pub fn dynamic_smem_base() -> u32 {
    gpu_or_emulator! {
        gpu: {
            let base: u32;
            // SAFETY: reads the address of a symbol.
            unsafe { ptx!("mov.u32 {b}, __clusterfuse_dynamic_smem;", b = out(reg32) base, options(pure, nomem, nostack)) };
            base
        },
        emulator: emu::memory::DYNAMIC_BASE,
    }
}

/// The 32-bit shared address of a static shared array: on the GPU `shared!` declares a
/// `.shared` symbol; on the emulator each call site (`site`, a unique static's address) gets
/// `bytes` of the block's static shared memory, the same offset in every block of the launch.
#[cfg(not(target_arch = "nvptx64"))]
pub fn static_shared_address(site: &'static u8, bytes: usize) -> u32 {
    emu::static_shared_address(site, bytes)
}

/// `%globaltimer`: nanoseconds on a clock every SM shares (for ordering events of different
/// blocks; nanoseconds of wall time on the emulator).
#[inline(always)]
pub fn globaltimer() -> u64 {
    gpu_or_emulator! {
        gpu: {
            let value: u64;
            // SAFETY: as for `clock64`.
            unsafe { ptx!("mov.u64 {v}, %globaltimer;", v = out(reg64) value, options(nomem, nostack)) };
            value
        },
        emulator: emu::clock(),
    }
}

/// `%clock64`: the multiprocessor's cycle counter (nanoseconds of wall time on the emulator).
#[inline(always)]
pub fn clock64() -> u64 {
    gpu_or_emulator! {
        gpu: {
            let value: u64;
            // SAFETY: reading a special register has no side effects; `volatile` (no `pure`) so
            // that successive reads are not merged.
            unsafe { ptx!("mov.u64 {v}, %clock64;", v = out(reg64) value, options(nomem, nostack)) };
            value
        },
        emulator: emu::clock(),
    }
}

// --- Barriers and fences (§9.7.13) -----------------------------------------------------------

/// `bar.sync 0`: waits until every thread of the block arrives; orders shared and global
/// memory among them (CUDA's `__syncthreads`).
#[inline(always)]
pub fn bar_sync() {
    gpu_or_emulator! {
        // SAFETY: a barrier has no memory-safety preconditions (a barrier that some threads
        // never reach hangs the block; that is a liveness bug, not undefined behaviour in Rust).
        gpu: unsafe { ptx!("bar.sync 0;", options(nostack)) },
        emulator: emu::block_barrier(),
    }
}

/// `bar.sync ID, THREADS`: waits until `THREADS` threads (a multiple of 32) arrive at named
/// barrier `ID` (1-15; 0 is [`bar_sync`]'s), a barrier of those threads alone. Both are
/// immediates: with a barrier in a register ptxas reserves all 16 of the block's barriers.
/// The emulator models the one use the library makes of it, a warpgroup's own barrier
/// (`Warpgroup::sync`: 128 threads).
#[inline(always)]
pub fn bar_sync_named<const ID: u32, const THREADS: u32>() {
    const { assert!(ID > 0 && ID < 16 && THREADS.is_multiple_of(32)) };
    gpu_or_emulator! {
        // SAFETY: as for `bar_sync`.
        gpu: unsafe { ptx!("bar.sync {id}, {n};", id = const ID, n = const THREADS, options(nostack)) },
        emulator: emu::warpgroup_barrier(ID, THREADS),
    }
}

/// `bar.warp.sync mask`: synchronises the warp's lanes named in `mask` (CUDA's `__syncwarp`).
#[inline(always)]
pub fn bar_warp_sync(mask: u32) {
    gpu_or_emulator! {
        // SAFETY: as for `bar_sync`.
        gpu: unsafe { ptx!("bar.warp.sync {m};", m = in(reg32) mask, options(nostack)) },
        emulator: emu::warp_barrier(mask),
    }
}

/// `fence.acq_rel.cta`.
#[inline(always)]
pub fn fence_acq_rel_cta() {
    gpu_or_emulator! {
        // SAFETY: a fence only orders memory operations.
        gpu: unsafe { ptx!("fence.acq_rel.cta;", options(nostack)) },
        emulator: emu::fence(),
    }
}

/// `fence.acq_rel.gpu`.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    gpu_or_emulator! {
        // SAFETY: a fence only orders memory operations.
        gpu: unsafe { ptx!("fence.acq_rel.gpu;", options(nostack)) },
        emulator: emu::fence(),
    }
}

/// `fence.acq_rel.cluster`.
#[inline(always)]
pub fn fence_acq_rel_cluster() {
    gpu_or_emulator! {
        // SAFETY: a fence only orders memory operations.
        gpu: unsafe { ptx!("fence.acq_rel.cluster;", options(nostack)) },
        emulator: emu::fence(),
    }
}

/// `barrier.cluster.arrive.release`: this thread has arrived at the cluster barrier; its
/// earlier writes (shared, distributed shared, global) are released to the cluster.
#[inline(always)]
pub fn barrier_cluster_arrive_release() {
    gpu_or_emulator! {
        // SAFETY: a barrier arrival has no memory-safety preconditions.
        gpu: unsafe { ptx!("barrier.cluster.arrive.release;", options(nostack)) },
        emulator: emu::cluster_arrive(),
    }
}

/// `barrier.cluster.arrive.relaxed`: arrival without release ordering (cheaper; pair with a
/// fence when writes must be visible).
#[inline(always)]
pub fn barrier_cluster_arrive_relaxed() {
    gpu_or_emulator! {
        // SAFETY: as above.
        gpu: unsafe { ptx!("barrier.cluster.arrive.relaxed;", options(nostack)) },
        emulator: emu::cluster_arrive(),
    }
}

/// `barrier.cluster.wait.acquire`: waits until every thread of every block in the cluster
/// has arrived; acquires what they released.
#[inline(always)]
pub fn barrier_cluster_wait_acquire() {
    gpu_or_emulator! {
        // SAFETY: as above.
        gpu: unsafe { ptx!("barrier.cluster.wait.acquire;", options(nostack)) },
        emulator: emu::cluster_wait(),
    }
}

/// `griddepcontrol.launch_dependents`: this block no longer holds back the kernel launched
/// after this one with programmatic dependent launch; that kernel may start once every block
/// of this grid has executed it or exited (PTX ISA 7.8, sm_90). It orders no memory: the
/// dependent sees this grid's writes only after its `griddepcontrol.wait`. A no-op without a
/// programmatic dependent, and on the emulator, which runs launches one after another.
#[inline(always)]
pub fn griddepcontrol_launch_dependents() {
    gpu_or_emulator! {
        // SAFETY: a scheduling hint; no memory-safety preconditions.
        gpu: unsafe { ptx!("griddepcontrol.launch_dependents;", options(nostack)) },
        emulator: (),
    }
}

/// `griddepcontrol.wait`: waits until every prerequisite grid (the kernel this one was
/// launched programmatically after) has completed and its memory operations are performed
/// and visible to this grid (PTX ISA 7.8, sm_90). Returns at once in a kernel launched
/// without programmatic serialization, and on the emulator, where the previous launch has
/// finished before this one starts.
#[inline(always)]
pub fn griddepcontrol_wait() {
    gpu_or_emulator! {
        // SAFETY: waits only; the memory clobber keeps later loads and stores after it.
        gpu: unsafe { ptx!("griddepcontrol.wait;", options(nostack)) },
        emulator: (),
    }
}

/// `mapa.shared::cluster.u32`: the distributed-shared address of the variable at shared
/// address `addr` in the block of cluster rank `rank`.
#[inline(always)]
pub fn mapa_shared_cluster(addr: u32, rank: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let out: u32;
            // SAFETY: address arithmetic only; using the result is what needs care.
            unsafe { ptx!("mapa.shared::cluster.u32 {o}, {a}, {r};", o = out(reg32) out, a = in(reg32) addr, r = in(reg32) rank, options(pure, nomem, nostack)) };
            out
        },
        emulator: emu::memory::mapa(addr, rank),
    }
}

// --- Warp shuffles and votes (§9.7.8.6, §9.7.8.7) -------------------------------------------

macro_rules! shuffle {
    ($($(#[$doc:meta])* $name:ident($arg:ident) => $mode:literal, $clamp:literal, $emulated:ident;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(value: u32, $arg: u32, member_mask: u32) -> u32 {
            gpu_or_emulator! {
                gpu: {
                    let out: u32;
                    // SAFETY: a shuffle reads registers of lanes in `member_mask` only.
                    unsafe {
                        ptx!(concat!("shfl.sync.", $mode, ".b32 {o}, {v}, {s}, ", $clamp, ", {m};"),
                             o = out(reg32) out, v = in(reg32) value, s = in(reg32) $arg,
                             m = in(reg32) member_mask, options(nomem, nostack))
                    };
                    out
                },
                emulator: emu::shuffle(emu::Shuffle::$emulated, value, $arg, member_mask),
            }
        }
    )*};
}

shuffle! {
    /// `shfl.sync.bfly.b32`: the value of lane `laneid ^ lane_mask`.
    shfl_sync_bfly_b32(lane_mask) => "bfly", "0x1f", Butterfly;
    /// `shfl.sync.down.b32`: the value of lane `laneid + delta` (own value past the warp's end).
    shfl_sync_down_b32(delta) => "down", "0x1f", Down;
    /// `shfl.sync.up.b32`: the value of lane `laneid - delta` (own value before lane 0).
    shfl_sync_up_b32(delta) => "up", "0", Up;
    /// `shfl.sync.idx.b32`: the value of lane `src_lane`.
    shfl_sync_idx_b32(src_lane) => "idx", "0x1f", Index;
}

/// `vote.sync.ballot.b32`: bit `i` set when lane `i`'s predicate is true.
#[inline(always)]
pub fn vote_sync_ballot_b32(predicate: bool, member_mask: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let out: u32;
            // SAFETY: a vote reads predicates of lanes in `member_mask` only.
            unsafe {
                ptx!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {o}, p, {m}; }}",
                     o = out(reg32) out, x = in(reg32) predicate as u32, m = in(reg32) member_mask,
                     options(nomem, nostack))
            };
            out
        },
        emulator: emu::shuffle(emu::Shuffle::Ballot, predicate as u32, 0, member_mask),
    }
}

// --- Shared memory (§9.7.9.8, §9.7.9.9) ------------------------------------------------------

/// A type that `ld.shared`/`st.shared` (and their `::cluster` forms) move in one instruction.
///
/// # Safety
/// The instructions must move exactly `size_of::<Self>()` bytes, and `to_bits` / `from_bits`
/// must be exact inverses.
pub unsafe trait SharedWord: Copy {
    /// The raw bits the instruction moves.
    type Bits: Copy;
    /// Reinterprets as raw bits.
    fn to_bits(self) -> Self::Bits;
    /// Reinterprets raw bits.
    fn from_bits(bits: Self::Bits) -> Self;
    /// `ld.shared` of one value at a 32-bit shared address.
    ///
    /// # Safety
    /// 1. `addr` is a `.shared::cta` address of a live, suitably aligned value of this type.
    unsafe fn ld_shared(addr: u32) -> Self;
    /// `st.shared` of one value at a 32-bit shared address.
    ///
    /// # Safety
    /// 1. `addr` is a `.shared::cta` address with room for a suitably aligned value of this type.
    unsafe fn st_shared(addr: u32, value: Self);
    /// `ld.shared::cluster` of one value at a 32-bit distributed-shared address (from `mapa`).
    ///
    /// # Safety
    /// 1. `addr` is a `.shared::cluster` address (from [`mapa_shared_cluster`]) of a live,
    ///    aligned value in a block of the cluster that has not exited.
    unsafe fn ld_shared_cluster(addr: u32) -> Self;
    /// `st.shared::cluster` of one value at a 32-bit distributed-shared address.
    ///
    /// # Safety
    /// 1. As for [`SharedWord::ld_shared_cluster`], with room for the value.
    unsafe fn st_shared_cluster(addr: u32, value: Self);
}

macro_rules! shared_word {
    ($ty:ty, $bits:ty, $ptx:literal, $reg:ident, |$v:ident| $to:expr, |$b:ident| $from:expr) => {
        // SAFETY: the PTX type named matches the Rust type's size; the conversions are bitwise.
        unsafe impl SharedWord for $ty {
            type Bits = $bits;
            #[inline(always)]
            fn to_bits(self) -> $bits { let $v = self; $to }
            #[inline(always)]
            fn from_bits($b: $bits) -> Self { $from }
            #[inline(always)]
            unsafe fn ld_shared(addr: u32) -> Self {
                gpu_or_emulator! {
                    gpu: {
                        let bits: $bits;
                        ptx!(concat!("ld.shared.", $ptx, " {v}, [{a}];"), v = out($reg) bits, a = in(reg32) addr, options(readonly, nostack));
                        Self::from_bits(bits)
                    },
                    emulator: emu::memory::load(addr, emu::memory::Space::Block),
                }
            }
            #[inline(always)]
            unsafe fn st_shared(addr: u32, value: Self) {
                gpu_or_emulator! {
                    gpu: ptx!(concat!("st.shared.", $ptx, " [{a}], {v};"), a = in(reg32) addr, v = in($reg) value.to_bits(), options(nostack)),
                    emulator: emu::memory::store(addr, value, emu::memory::Space::Block),
                }
            }
            #[inline(always)]
            unsafe fn ld_shared_cluster(addr: u32) -> Self {
                gpu_or_emulator! {
                    gpu: {
                        let bits: $bits;
                        ptx!(concat!("ld.shared::cluster.", $ptx, " {v}, [{a}];"), v = out($reg) bits, a = in(reg32) addr, options(readonly, nostack));
                        Self::from_bits(bits)
                    },
                    emulator: emu::memory::load(addr, emu::memory::Space::Cluster),
                }
            }
            #[inline(always)]
            unsafe fn st_shared_cluster(addr: u32, value: Self) {
                gpu_or_emulator! {
                    gpu: ptx!(concat!("st.shared::cluster.", $ptx, " [{a}], {v};"), a = in(reg32) addr, v = in($reg) value.to_bits(), options(nostack)),
                    emulator: emu::memory::store(addr, value, emu::memory::Space::Cluster),
                }
            }
        }
    };
}

shared_word!(u16, u16, "b16", reg16, |v| v, |b| b);
shared_word!(i16, u16, "b16", reg16, |v| v as u16, |b| b as i16);
shared_word!(u32, u32, "b32", reg32, |v| v, |b| b);
shared_word!(i32, u32, "b32", reg32, |v| v as u32, |b| b as i32);
shared_word!(f32, u32, "b32", reg32, |v| v.to_bits(), |b| f32::from_bits(b));
shared_word!(u64, u64, "b64", reg64, |v| v, |b| b);
shared_word!(i64, u64, "b64", reg64, |v| v as u64, |b| b as i64);
shared_word!(f64, u64, "b64", reg64, |v| v.to_bits(), |b| f64::from_bits(b));
shared_word!(crate::f16, u16, "b16", reg16, |v| v.to_bits(), |b| crate::f16::from_bits(b));
shared_word!(crate::bf16, u16, "b16", reg16, |v| v.to_bits(), |b| crate::bf16::from_bits(b));

/// `{a, b, c, d}` for a `.v4.b32` operand.
#[cfg(target_arch = "nvptx64")]
macro_rules! v4_load {
    ($op:literal, $addr:expr) => {{
        let (a, b, c, d): (u32, u32, u32, u32);
        ptx!(concat!($op, ".v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];"), a = out(reg32) a, b = out(reg32) b,
             c = out(reg32) c, d = out(reg32) d, p = in(reg32) $addr, options(readonly, nostack));
        [a, b, c, d]
    }};
}

#[cfg(target_arch = "nvptx64")]
macro_rules! v4_store {
    ($op:literal, $addr:expr, $value:expr) => {{
        let value: [u32; 4] = $value;
        ptx!(concat!($op, ".v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};"), p = in(reg32) $addr, a = in(reg32) value[0],
             b = in(reg32) value[1], c = in(reg32) value[2], d = in(reg32) value[3], options(nostack));
    }};
}

// SAFETY: `.v4.b32` moves 16 bytes, the size of `[u32; 4]`.
unsafe impl SharedWord for [u32; 4] {
    type Bits = [u32; 4];
    #[inline(always)]
    fn to_bits(self) -> [u32; 4] { self }
    #[inline(always)]
    fn from_bits(bits: [u32; 4]) -> Self { bits }
    #[inline(always)]
    unsafe fn ld_shared(addr: u32) -> Self {
        gpu_or_emulator! {
            gpu: v4_load!("ld.shared", addr),
            emulator: emu::memory::load(addr, emu::memory::Space::Block),
        }
    }
    #[inline(always)]
    unsafe fn st_shared(addr: u32, value: Self) {
        gpu_or_emulator! {
            gpu: v4_store!("st.shared", addr, value),
            emulator: emu::memory::store(addr, value, emu::memory::Space::Block),
        }
    }
    #[inline(always)]
    unsafe fn ld_shared_cluster(addr: u32) -> Self {
        gpu_or_emulator! {
            gpu: v4_load!("ld.shared::cluster", addr),
            emulator: emu::memory::load(addr, emu::memory::Space::Cluster),
        }
    }
    #[inline(always)]
    unsafe fn st_shared_cluster(addr: u32, value: Self) {
        gpu_or_emulator! {
            gpu: v4_store!("st.shared::cluster", addr, value),
            emulator: emu::memory::store(addr, value, emu::memory::Space::Cluster),
        }
    }
}

/// `atom.shared.add.f32`; returns the old value.
///
/// # Safety
/// 1. `addr` is a `.shared::cta` address of a live, 4-byte-aligned `f32`.
#[inline(always)]
pub unsafe fn atom_shared_add_f32(addr: u32, value: f32) -> f32 {
    gpu_or_emulator! {
        gpu: {
            let old: f32;
            ptx!("atom.shared.add.f32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg32) addr, v = in(reg32) value, options(nostack));
            old
        },
        emulator: emu::memory::atomic(addr, |old: f32| old + value),
    }
}

/// `atom.shared.add.u32`; returns the old value.
///
/// # Safety
/// 1. `addr` is a `.shared::cta` address of a live, 4-byte-aligned `u32`.
#[inline(always)]
pub unsafe fn atom_shared_add_u32(addr: u32, value: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let old: u32;
            ptx!("atom.shared.add.u32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg32) addr, v = in(reg32) value, options(nostack));
            old
        },
        emulator: emu::memory::atomic(addr, |old: u32| old.wrapping_add(value)),
    }
}

/// `atom.shared.or.b32`; returns the old value.
///
/// # Safety
/// 1. `addr` is a `.shared::cta` address of a live, 4-byte-aligned `u32`.
#[inline(always)]
pub unsafe fn atom_shared_or_b32(addr: u32, value: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let old: u32;
            ptx!("atom.shared.or.b32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg32) addr, v = in(reg32) value, options(nostack));
            old
        },
        emulator: emu::memory::atomic(addr, |old: u32| old | value),
    }
}

// --- mbarriers and bulk copies (§9.7.13.15, §9.7.9.25) ---------------------------------------

/// `mbarrier.init.shared::cta.b64`: a barrier object at `addr` expecting `arrivals` per phase.
///
/// # Safety
/// 1. `addr` is an 8-byte-aligned `.shared::cta` address of 8 bytes used only as this barrier.
/// 2. No thread uses the barrier until the initialisation is made visible (by
///    [`fence_mbarrier_init_release_cluster`] and a barrier).
#[inline(always)]
pub unsafe fn mbarrier_init_shared_b64(addr: u32, arrivals: u32) {
    gpu_or_emulator! {
        gpu: ptx!("mbarrier.init.shared::cta.b64 [{a}], {n};", a = in(reg32) addr, n = in(reg32) arrivals, options(nostack)),
        emulator: emu::mbarrier_init(addr, arrivals),
    }
}

/// `fence.mbarrier_init.release.cluster`: makes this thread's `mbarrier.init`s visible to the
/// cluster (pair with a cluster barrier before peers signal them).
#[inline(always)]
pub fn fence_mbarrier_init_release_cluster() {
    gpu_or_emulator! {
        // SAFETY: a fence only orders memory operations.
        gpu: unsafe { ptx!("fence.mbarrier_init.release.cluster;", options(nostack)) },
        emulator: emu::fence(),
    }
}

/// `mbarrier.arrive.expect_tx.release.cta.shared::cta.b64`: one arrival at the barrier at
/// `addr`, which also expects `bytes` more of asynchronous copies in the current phase.
///
/// # Safety
/// 1. `addr` is an initialised barrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive_expect_tx_shared_b64(addr: u32, bytes: u32) {
    gpu_or_emulator! {
        gpu: ptx!("{{ .reg .b64 state; mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 state, [{a}], {b}; }}",
                  a = in(reg32) addr, b = in(reg32) bytes, options(nostack)),
        emulator: emu::mbarrier_arrive_expect_tx(addr, bytes),
    }
}

/// `fence.proxy.async.shared::cta`: orders this thread's earlier generic-proxy accesses to
/// shared memory (ordinary `st.shared`) before later async-proxy ones (`cp.async.bulk` reading
/// that memory). A barrier alone orders only the generic proxy.
#[inline(always)]
pub fn fence_proxy_async_shared_cta() {
    gpu_or_emulator! {
        // SAFETY: a fence only orders memory operations.
        gpu: unsafe { ptx!("fence.proxy.async.shared::cta;", options(nostack)) },
        emulator: emu::fence(),
    }
}

macro_rules! mbarrier_try_wait {
    ($(#[$doc:meta])* $name:ident => $ptx:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// 1. `addr` is an initialised barrier in this block's shared memory.
        #[inline(always)]
        pub unsafe fn $name(addr: u32, parity: u32) -> bool {
            gpu_or_emulator! {
                gpu: {
                    let done: u32;
                    ptx!(concat!("{{ .reg .pred p; ", $ptx, " p, [{a}], {q}; selp.u32 {d}, 1, 0, p; }}"),
                         d = out(reg32) done, a = in(reg32) addr, q = in(reg32) parity, options(nostack));
                    done != 0
                },
                emulator: emu::mbarrier_try_wait(addr, parity),
            }
        }
    };
}

mbarrier_try_wait! {
    /// `mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64`: true once the phase of parity
    /// `parity` of the barrier at `addr` has completed (the hardware may suspend the thread a
    /// while first); acquires, at cluster scope, what the phase's arrivals (also from other
    /// blocks of the cluster) and copies released. On the GPU each success also invalidates
    /// the SM's L1 (`CCTL.IVALL`).
    mbarrier_try_wait_parity_shared_b64 => "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64"
}

mbarrier_try_wait! {
    /// `mbarrier.try_wait.parity.acquire.cta.shared::cta.b64`: as
    /// [`mbarrier_try_wait_parity_shared_b64`], acquiring at block scope only, for a barrier
    /// whose arrivals are this block's and whose copies are its own TMA loads (a TMA pipeline):
    /// no L1 invalidation.
    mbarrier_try_wait_parity_cta_shared_b64 => "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64"
}

/// `cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes`: copies `bytes`
/// from this block's shared memory at `src` to the distributed-shared address `dst`
/// asynchronously; their arrival completes that many bytes of the barrier at `barrier`, a
/// distributed-shared address in the destination's block.
///
/// # Safety
/// 1. `src` and `dst` are 16-byte aligned, `bytes` is a multiple of 16, and both ranges lie in
///    live shared memory; `dst` and `barrier` come from [`mapa_shared_cluster`] of the same rank.
/// 2. Nothing writes `src` or touches `dst` until the barrier's phase has completed (and, for
///    `src`, until the issuing block learns so, e.g. through a cluster barrier).
/// 3. Ordinary stores to `src` were ordered before the copy by
///    [`fence_proxy_async_shared_cta`] in the storing threads, then a barrier.
#[inline(always)]
pub unsafe fn cp_async_bulk_shared_cluster_shared_cta(dst: u32, src: u32, bytes: u32, barrier: u32) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{m}];",
                  d = in(reg32) dst, s = in(reg32) src, n = in(reg32) bytes, m = in(reg32) barrier, options(nostack)),
        emulator: emu::bulk_copy(dst, src, bytes, barrier),
    }
}

/// `st.async.shared::cluster.mbarrier::complete_tx::bytes.b64`: stores `value` at the
/// distributed-shared address `dst` asynchronously (no fence: `STAS` in SASS); its arrival
/// completes 8 bytes of the barrier at `barrier`, a distributed-shared address in the
/// destination's block.
///
/// # Safety
/// 1. `dst` is an 8-byte aligned `u64` of live shared memory; `dst` and `barrier` come from
///    [`mapa_shared_cluster`] of the same rank.
/// 2. Nothing reads or writes `dst` until the barrier's phase has completed.
#[inline(always)]
pub unsafe fn st_async_shared_cluster_b64(dst: u32, value: u64, barrier: u32) {
    gpu_or_emulator! {
        gpu: ptx!("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [{d}], {v}, [{m}];",
                  d = in(reg32) dst, v = in(reg64) value, m = in(reg32) barrier, options(nostack)),
        emulator: emu::store_async(dst, value, barrier),
    }
}

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`: starts copying `bytes`
/// from global `src` to this block's shared memory at `dst` (through L2, no registers); their
/// arrival completes that many bytes of the barrier at `barrier`.
///
/// # Safety
/// 1. `src` is 16-byte aligned, `bytes` is a multiple of 16, and `src .. src + bytes` is
///    readable global memory that no thread writes during the kernel.
/// 2. `dst` is a 16-byte-aligned `.shared::cta` address of this block with room for `bytes`,
///    that nothing touches until the barrier's phase completes.
/// 3. `barrier` is an initialised mbarrier of this block whose current phase expects these
///    bytes ([`mbarrier_arrive_expect_tx_shared_b64`]).
#[inline(always)]
pub unsafe fn cp_async_bulk_shared_cluster_global(dst: u32, src: *const u8, bytes: u32, barrier: u32) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{m}];",
                  d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, m = in(reg32) barrier, options(nostack)),
        emulator: emu::bulk_load(dst, src, bytes, barrier),
    }
}

/// `cp.async.bulk.prefetch.L2.global`: asks L2 to fetch the `bytes` at global `src` from
/// memory (PTX ISA 8.0, sm_90). A hint: it changes what no load returns and completes on
/// nothing, but the issuing thread waits until L2 takes the request (an H100 warp issuing 32
/// of 4 KB was held 4.3 µs while the HBM was busy: results/moe-h200.md, session 51).
///
/// # Safety
/// 1. `src` is 16-byte aligned, `bytes` is a multiple of 16, and `src .. src + bytes` is
///    global memory of one live allocation.
#[inline(always)]
pub unsafe fn cp_async_bulk_prefetch_l2_global(src: *const u8, bytes: u32) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.bulk.prefetch.L2.global [{s}], {n};", s = in(reg64) src, n = in(reg32) bytes, options(nostack)),
        emulator: {
            if !(src as usize).is_multiple_of(16) || !bytes.is_multiple_of(16) {
                emu::fault(format_args!("bulk prefetch of {bytes} bytes at {:#x}: not 16-byte aligned", src as usize));
            }
            emu::global_range(src, bytes as usize, || ())
        },
    }
}

// --- Global memory (§9.7.9.8, §9.7.13.5) -----------------------------------------------------

/// `createpolicy.fractional.L2::evict_first.b64` with fraction 1: an L2 eviction policy for
/// the `.L2::cache_hint` forms of loads, under which every line they bring in is the first
/// L2 evicts — for data read once (a stream of weights), so that it does not push out what
/// is read again (activations, small tables, the kernels' own code). A hint: it changes what
/// no load returns.
#[inline(always)]
pub fn createpolicy_l2_evict_first() -> u64 {
    gpu_or_emulator! {
        gpu: {
            let policy: u64;
            // SAFETY: computes a register value only.
            unsafe { ptx!("createpolicy.fractional.L2::evict_first.b64 {p}, 1.0;", p = out(reg64) policy, options(pure, nomem, nostack)) };
            policy
        },
        emulator: 0,
    }
}

/// `ld.global.nc.L2::cache_hint.v4.b32`: as [`ld_global_nc_v4_b32`], the line it brings into
/// L2 kept by the eviction `policy` ([`createpolicy_l2_evict_first`]).
///
/// # Safety
/// As [`ld_global_nc_v4_b32`]; `policy` comes from a `createpolicy` of this thread.
#[inline(always)]
pub unsafe fn ld_global_nc_l2_hint_v4_b32(ptr: *const [u32; 4], policy: u64) -> [u32; 4] {
    gpu_or_emulator! {
        gpu: {
            let (a, b, c, d): (u32, u32, u32, u32);
            ptx!("ld.global.nc.L2::cache_hint.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}], {h};", a = out(reg32) a, b = out(reg32) b,
                 c = out(reg32) c, d = out(reg32) d, p = in(reg64) ptr, h = in(reg64) policy, options(readonly, nostack, pure));
            [a, b, c, d]
        },
        emulator: {
            let _ = policy;
            emu::global_access(ptr, 16, || ptr.read())
        },
    }
}

/// 16-byte global loads, one function per PTX load instruction.
macro_rules! global_v4_load {
    ($($(#[$doc:meta])* $name:ident => $op:literal;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub unsafe fn $name(ptr: *const [u32; 4]) -> [u32; 4] {
            gpu_or_emulator! {
                gpu: {
                    let (a, b, c, d): (u32, u32, u32, u32);
                    ptx!(concat!($op, " {{{a}, {b}, {c}, {d}}}, [{p}];"), a = out(reg32) a, b = out(reg32) b,
                         c = out(reg32) c, d = out(reg32) d, p = in(reg64) ptr, options(readonly, nostack, pure));
                    [a, b, c, d]
                },
                emulator: emu::global_access(ptr, 16, || ptr.read()),
            }
        }
    )*};
}

global_v4_load! {
    /// `ld.global.v4.b32`: 16 bytes through the coherent path, ordered after every barrier and
    /// `griddepcontrol.wait` before it.
    ///
    /// # Safety
    /// 1. `ptr` is a 16-byte-aligned global address of 16 readable bytes.
    ld_global_v4_b32 => "ld.global.v4.b32";
    /// `ld.global.nc.v4.b32`: 16 bytes through the read-only path, which ptxas treats as
    /// invariant for the whole kernel: it may issue the load before a `griddepcontrol.wait`
    /// that precedes it in the program (it once did with example 08's loads of x, which the
    /// kernel before may write).
    ///
    /// # Safety
    /// 1. `ptr` is a 16-byte-aligned global address of 16 readable bytes that no grid writes
    ///    while this kernel runs: neither this one nor one it was launched programmatically
    ///    after (weights and parameters, not activations).
    ld_global_nc_v4_b32 => "ld.global.nc.v4.b32";
}

/// `st.global.v4.b32`: 16 bytes in one store.
///
/// # Safety
/// 1. `ptr` is a 16-byte-aligned global address of 16 writable bytes.
#[inline(always)]
pub unsafe fn st_global_v4_b32(ptr: *mut [u32; 4], value: [u32; 4]) {
    gpu_or_emulator! {
        gpu: ptx!("st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg64) ptr, a = in(reg32) value[0],
                  b = in(reg32) value[1], c = in(reg32) value[2], d = in(reg32) value[3], options(nostack)),
        emulator: emu::global_access(ptr, 16, || ptr.write(value)),
    }
}

macro_rules! global_atomic {
    ($($(#[$doc:meta])* $name:ident($ty:ty) => $ptx:literal, |$old:ident, $value:ident| $update:expr;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        #[doc = concat!("1. `ptr` is an aligned global address of a live `", stringify!($ty), "`.")]
        #[inline(always)]
        pub unsafe fn $name(ptr: *mut $ty, $value: $ty) -> $ty {
            gpu_or_emulator! {
                gpu: {
                    let old: $ty;
                    ptx!(concat!($ptx, " {o}, [{p}], {v};"), o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) $value, options(nostack));
                    old
                },
                emulator: emu::global_access(ptr, 4, || emu::atomic_update(ptr, |$old: $ty| $update)),
            }
        }
    )*};
}

global_atomic! {
    /// `atom.global.add.f32`; returns the old value.
    atom_global_add_f32(f32) => "atom.global.add.f32", |old, value| old + value;
    /// `atom.global.add.u32`; returns the old value.
    atom_global_add_u32(u32) => "atom.global.add.u32", |old, value| old.wrapping_add(value);
    /// `atom.global.max.s32`; returns the old value.
    atom_global_max_s32(i32) => "atom.global.max.s32", |old, value| old.max(value);
}

/// `ld.acquire.gpu.global.u32`: a load that acquires at GPU scope what the writer of the value
/// it reads released (PTX ISA §8, memory consistency model): after it, this thread sees every
/// write that happened before that release, whichever SM made it.
///
/// # Safety
/// 1. `ptr` is an aligned global address of a live `u32`.
#[inline(always)]
pub unsafe fn ld_acquire_gpu_global_u32(ptr: *const u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let value: u32;
            ptx!("ld.acquire.gpu.global.u32 {v}, [{p}];", v = out(reg32) value, p = in(reg64) ptr, options(nostack));
            value
        },
        emulator: emu::global_access(ptr, 4, || emu::acquire_load(ptr.cast::<[u32; 1]>())[0]),
    }
}

/// `ld.acquire.gpu.global.v4.u32`: four words in one acquiring load (see
/// [`ld_acquire_gpu_global_u32`]).
///
/// # Safety
/// 1. `ptr` is a 16-byte-aligned global address of four live `u32`s.
#[inline(always)]
pub unsafe fn ld_acquire_gpu_global_v4_u32(ptr: *const [u32; 4]) -> [u32; 4] {
    gpu_or_emulator! {
        gpu: {
            let v: [u32; 4];
            let (a, b, c, d): (u32, u32, u32, u32);
            ptx!("ld.acquire.gpu.global.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg64) ptr, options(nostack));
            v = [a, b, c, d];
            v
        },
        emulator: emu::global_access(ptr, 16, || emu::acquire_load(ptr)),
    }
}

/// `ld.relaxed.gpu.global.u32`: a load that sees other SMs' stores to the word (no stale L1
/// copy), ordering nothing else.
///
/// # Safety
/// 1. `ptr` is an aligned global address of a live `u32`.
#[inline(always)]
pub unsafe fn ld_relaxed_gpu_global_u32(ptr: *const u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let value: u32;
            ptx!("ld.relaxed.gpu.global.u32 {v}, [{p}];", v = out(reg32) value, p = in(reg64) ptr, options(nostack));
            value
        },
        emulator: emu::global_access(ptr, 4, || emu::atomic_update(ptr.cast_mut(), |old: u32| old)),
    }
}

/// `st.release.gpu.global.u32`: stores `value`, releasing at GPU scope this thread's earlier
/// writes (and those ordered before them, by a `bar.sync` say) to whoever acquires it.
///
/// # Safety
/// 1. `ptr` is an aligned global address of a live `u32`.
#[inline(always)]
pub unsafe fn st_release_gpu_global_u32(ptr: *mut u32, value: u32) {
    gpu_or_emulator! {
        gpu: ptx!("st.release.gpu.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack)),
        emulator: emu::global_access(ptr, 4, || { emu::atomic_update(ptr, |_: u32| value); }),
    }
}

/// `atom.acq_rel.gpu.global.add.u32`: adds `value`, returns the old value; acquires and
/// releases at GPU scope.
///
/// # Safety
/// 1. `ptr` is an aligned global address of a live `u32`.
#[inline(always)]
pub unsafe fn atom_acq_rel_gpu_global_add_u32(ptr: *mut u32, value: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let old: u32;
            ptx!("atom.acq_rel.gpu.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack));
            old
        },
        emulator: emu::global_access(ptr, 4, || emu::atomic_update(ptr, |old: u32| old.wrapping_add(value))),
    }
}

/// `st.relaxed.gpu.global.u32`: a store other SMs see without a stale L1 copy in the way.
///
/// # Safety
/// 1. `ptr` is an aligned global address of a live `u32`.
#[inline(always)]
pub unsafe fn st_relaxed_gpu_global_u32(ptr: *mut u32, value: u32) {
    gpu_or_emulator! {
        gpu: ptx!("st.relaxed.gpu.global.u32 [{p}], {v};", p = in(reg64) ptr, v = in(reg32) value, options(nostack)),
        emulator: emu::global_access(ptr, 4, || { emu::atomic_update(ptr, |_: u32| value); }),
    }
}

/// `nanosleep.u32`: suspends the thread for about `ns` nanoseconds (at most 1 ms; PTX ISA
/// 6.3, sm_70): the back-off of a spin on global memory. On the emulator it yields to the
/// other threads of the launch, which is how a spin there makes progress (and how a spin
/// that can never end is found: see [`crate::emu`]).
#[inline(always)]
pub fn nanosleep(ns: u32) {
    gpu_or_emulator! {
        // SAFETY: a pause; no memory-safety preconditions.
        gpu: unsafe { ptx!("nanosleep.u32 {t};", t = in(reg32) ns, options(nostack)) },
        emulator: { let _ = ns; emu::sleep() },
    }
}

// --- Arithmetic (§9.7.3) ---------------------------------------------------------------------

macro_rules! unary_f32 {
    ($($(#[$doc:meta])* $name:ident => $ptx:literal, |$x:ident| $emulated:expr;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name($x: f32) -> f32 {
            gpu_or_emulator! {
                gpu: {
                    let y: f32;
                    // SAFETY: arithmetic only.
                    unsafe { ptx!(concat!($ptx, " {y}, {x};"), y = out(reg32) y, x = in(reg32) $x, options(pure, nomem, nostack)) };
                    y
                },
                emulator: $emulated,
            }
        }
    )*};
}

unary_f32! {
    /// `ex2.approx.ftz.f32`: `2^x`, about 2 ulp.
    ex2_approx_ftz_f32 => "ex2.approx.ftz.f32", |x| x.exp2();
    /// `rsqrt.approx.ftz.f32`: `1 / sqrt(x)`, about 2 ulp.
    rsqrt_approx_ftz_f32 => "rsqrt.approx.ftz.f32", |x| 1.0 / x.sqrt();
    /// `rcp.approx.ftz.f32`: `1 / x`, about 1 ulp.
    rcp_approx_ftz_f32 => "rcp.approx.ftz.f32", |x| 1.0 / x;
    /// `tanh.approx.f32` (sm_75+): maximum relative error about 2^-11.
    tanh_approx_f32 => "tanh.approx.f32", |x| x.tanh();
    /// `sqrt.rn.f32`: correctly rounded square root.
    sqrt_rn_f32 => "sqrt.rn.f32", |x| x.sqrt();
}

/// `fma.rn.f32`: `a * b + c` with one rounding.
#[inline(always)]
pub fn fma_rn_f32(a: f32, b: f32, c: f32) -> f32 {
    gpu_or_emulator! {
        gpu: {
            let d: f32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack)) };
            d
        },
        emulator: a.mul_add(b, c),
    }
}

/// `max.NaN.f32` (sm_80+): the larger of `a` and `b`, NaN when either is NaN.
#[inline(always)]
pub fn max_nan_f32(a: f32, b: f32) -> f32 {
    gpu_or_emulator! {
        gpu: {
            let d: f32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("max.NaN.f32 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack)) };
            d
        },
        emulator: if a.is_nan() || b.is_nan() { f32::NAN } else { a.max(b) },
    }
}

macro_rules! half_op {
    ($($(#[$doc:meta])* $name:ident($($arg:ident),*) => $ptx:literal, $ty:ident, |$($x:ident),*| $emulated:expr;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name($($arg: u16),*) -> u16 {
            gpu_or_emulator! {
                gpu: {
                    let d: u16;
                    // SAFETY: arithmetic only.
                    unsafe { ptx!(concat!($ptx, " {d}, ", half_op!(@ops $($arg),*), ";"), d = out(reg16) d, $($arg = in(reg16) $arg),*, options(pure, nomem, nostack)) };
                    d
                },
                // Exact in f64 for these widths, then rounded once.
                emulator: {
                    let ($($x),*) = ($(crate::$ty::from_bits($arg).to_f64()),*);
                    crate::$ty::from_f64($emulated).to_bits()
                },
            }
        }
    )*};
    (@ops $a:ident) => { "{a}" };
    (@ops $a:ident, $b:ident) => { "{a}, {b}" };
    (@ops $a:ident, $b:ident, $c:ident) => { "{a}, {b}, {c}" };
}

half_op! {
    /// `add.rn.f16` on raw bits.
    add_rn_f16(a, b) => "add.rn.f16", f16, |x, y| x + y;
    /// `mul.rn.f16` on raw bits.
    mul_rn_f16(a, b) => "mul.rn.f16", f16, |x, y| x * y;
    /// `fma.rn.f16` on raw bits.
    fma_rn_f16(a, b, c) => "fma.rn.f16", f16, |x, y, z| x * y + z;
    /// `add.rn.bf16` (sm_90) on raw bits.
    add_rn_bf16(a, b) => "add.rn.bf16", bf16, |x, y| x + y;
    /// `mul.rn.bf16` (sm_90) on raw bits.
    mul_rn_bf16(a, b) => "mul.rn.bf16", bf16, |x, y| x * y;
    /// `fma.rn.bf16` (sm_80) on raw bits.
    fma_rn_bf16(a, b, c) => "fma.rn.bf16", bf16, |x, y, z| x * y + z;
}

/// `cvt.rn.bf16.f32`: rounds to the nearest bf16 (raw bits).
#[inline(always)]
pub fn cvt_rn_bf16_f32(x: f32) -> u16 {
    gpu_or_emulator! {
        gpu: {
            let y: u16;
            // SAFETY: arithmetic only.
            unsafe { ptx!("cvt.rn.bf16.f32 {y}, {x};", y = out(reg16) y, x = in(reg32) x, options(pure, nomem, nostack)) };
            y
        },
        emulator: crate::bf16::from_f32(x).to_bits(),
    }
}

/// `cvt.f32.bf16`: widens a bf16 (raw bits), exactly.
#[inline(always)]
pub fn cvt_f32_bf16(x: u16) -> f32 {
    gpu_or_emulator! {
        gpu: {
            let y: f32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("cvt.f32.bf16 {y}, {x};", y = out(reg32) y, x = in(reg16) x, options(pure, nomem, nostack)) };
            y
        },
        emulator: crate::bf16::from_bits(x).to_f32(),
    }
}

/// `cvt.rn.f16x2.f32` (sm_80+): `a` and `b` rounded to f16 and packed, `a` in the upper half.
#[inline(always)]
pub fn cvt_rn_f16x2_f32(a: f32, b: f32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let d: u32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("cvt.rn.f16x2.f32 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack)) };
            d
        },
        emulator: (crate::f16::from_f32(a).to_bits() as u32) << 16 | crate::f16::from_f32(b).to_bits() as u32,
    }
}

/// The halves of an f16x2 register, low first, widened to f32 on the host (the emulator).
#[cfg(not(target_arch = "nvptx64"))]
fn f16x2_halves(x: u32) -> [f32; 2] {
    [crate::f16::from_bits(x as u16).to_f32(), crate::f16::from_bits((x >> 16) as u16).to_f32()]
}

/// `add.rn.f16x2` (sm_53+): the pairs of f16 of `a` and `b` added, each sum rounded to f16.
#[inline(always)]
pub fn add_rn_f16x2(a: u32, b: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let d: u32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("add.rn.f16x2 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack)) };
            d
        },
        // The sum of two f16 is exact in f32, so rounding it once is `add.rn`'s result.
        emulator: {
            let (a, b) = (f16x2_halves(a), f16x2_halves(b));
            cvt_rn_f16x2_f32(a[1] + b[1], a[0] + b[0])
        },
    }
}

/// `fma.rn.f16x2` (sm_53+): `a · b + c` on the pairs of f16, each rounded once to f16.
#[inline(always)]
pub fn fma_rn_f16x2(a: u32, b: u32, c: u32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let d: u32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("fma.rn.f16x2 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack)) };
            d
        },
        // a · b is exact in f32; the sum is taken in f64 and rounded through f32 to f16.
        emulator: {
            let (a, b, c) = (f16x2_halves(a), f16x2_halves(b), f16x2_halves(c));
            let fma = |i: usize| ((a[i] * b[i]) as f64 + c[i] as f64) as f32;
            cvt_rn_f16x2_f32(fma(1), fma(0))
        },
    }
}

/// `cvt.rn.bf16x2.f32` (sm_80+): `a` and `b` rounded to bf16 and packed, `a` in the upper half.
#[inline(always)]
pub fn cvt_rn_bf16x2_f32(a: f32, b: f32) -> u32 {
    gpu_or_emulator! {
        gpu: {
            let d: u32;
            // SAFETY: arithmetic only.
            unsafe { ptx!("cvt.rn.bf16x2.f32 {d}, {a}, {b};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, options(pure, nomem, nostack)) };
            d
        },
        emulator: (crate::bf16::from_f32(a).to_bits() as u32) << 16 | crate::bf16::from_f32(b).to_bits() as u32,
    }
}

/// `trap`: aborts the kernel; the launch fails with `CUDA_ERROR_ILLEGAL_INSTRUCTION` (on the
/// emulator, with the kernel, block and thread that trapped).
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the kernel.
    #[cfg(target_arch = "nvptx64")]
    unsafe {
        ptx!("trap;", options(noreturn, nostack))
    }
    #[cfg(not(target_arch = "nvptx64"))]
    emu::trap("trap")
}

// --- Tensor cores (§9.7.14) and asynchronous copies (§9.7.9.25) ------------------------------

macro_rules! mma_m16n8k16 {
    ($($(#[$doc:meta])* $name:ident => $ptx:literal, $kind:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// A warp collective (`.sync.aligned`): all 32 lanes execute it together, each giving
        /// its fragment registers in the layouts of PTX ISA §9.7.14.5.8 (see [`crate::mma`]).
        #[inline(always)]
        pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
            gpu_or_emulator! {
                gpu: {
                    let mut d = c;
                    // SAFETY: registers only; every lane of the warp executes it (the caller's
                    // contract as for any `.aligned` instruction: no divergence here).
                    unsafe {
                        ptx!(concat!($ptx, " {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};"),
                             d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
                             a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                             b0 = in(reg32) b[0], b1 = in(reg32) b[1], options(nomem, nostack))
                    };
                    d
                },
                emulator: emu::mma_m16n8k16(emu::HalfKind::$kind, a, b, c),
            }
        }
    )*};
}

mma_m16n8k16! {
    /// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: `D = A·B + C` for a 16×16 f16
    /// A, a 16×8 f16 B and a 16×8 f32 C, spread over the warp.
    mma_sync_m16n8k16_row_col_f32_f16_f16_f32 => "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", F16;
    /// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: as the f16 form, bf16 inputs.
    mma_sync_m16n8k16_row_col_f32_bf16_bf16_f32 => "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", Bf16;
}

macro_rules! ldmatrix {
    ($($(#[$doc:meta])* $name:ident => $ptx:literal, $count:literal, $trans:literal, [$($d:ident),*];)*) => {$(
        $(#[$doc])*
        ///
        /// A warp collective (§9.7.14.5.15): lanes `8j .. 8j + 8` give the shared addresses of
        /// rows 0-7 of matrix `j` (16 bytes each, 16-byte aligned); register `j` of lane `l`
        /// receives row `l / 4`, columns `2 (l % 4) ..+ 2` of matrix `j` (of its transpose
        /// with `.trans`). Lanes past the last matrix's give no address.
        ///
        /// # Safety
        /// 1. For each lane that gives one, `row_addr .. row_addr + 16` is a 16-byte-aligned
        ///    `.shared::cta` address range of this block that no thread writes concurrently.
        /// 2. Every lane of the warp executes it together.
        #[inline(always)]
        pub unsafe fn $name(row_addr: u32) -> [u32; $count] {
            gpu_or_emulator! {
                gpu: {
                    $(let $d: u32;)*
                    ptx!(concat!($ptx, " {{", ldmatrix!(@regs $($d),*), "}}, [{p}];"),
                         $($d = out(reg32) $d,)* p = in(reg32) row_addr, options(readonly, nostack));
                    [$($d),*]
                },
                emulator: {
                    let all = emu::ldmatrix($count, $trans, row_addr);
                    core::array::from_fn(|j| all[j])
                },
            }
        }
    )*};
    (@regs $a:ident, $b:ident) => { "{a}, {b}" };
    (@regs $a:ident, $b:ident, $c:ident, $d:ident) => { "{a}, {b}, {c}, {d}" };
}

ldmatrix! {
    /// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`: four 8×8 matrices of 16-bit values.
    ldmatrix_sync_aligned_m8n8_x4_shared_b16 => "ldmatrix.sync.aligned.m8n8.x4.shared.b16", 4, false, [a, b, c, d];
    /// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: four 8×8 matrices, each transposed.
    ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16 => "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16", 4, true, [a, b, c, d];
    /// `ldmatrix.sync.aligned.m8n8.x2.shared.b16`: two 8×8 matrices (lanes 0-15 give rows).
    ldmatrix_sync_aligned_m8n8_x2_shared_b16 => "ldmatrix.sync.aligned.m8n8.x2.shared.b16", 2, false, [a, b];
    /// `ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16`: two 8×8 matrices, each transposed.
    ldmatrix_sync_aligned_m8n8_x2_trans_shared_b16 => "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16", 2, true, [a, b];
}

/// `cp.async.cg.shared.global [dst], [src], 16, src_size`: starts copying 16 bytes from
/// global `src` to shared `dst` through L2 only, writing zeros past `src_size` bytes
/// (`src_size = 0` zero-fills `dst` and reads nothing). Completes at
/// [`cp_async_wait_group`] after the [`cp_async_commit_group`] that follows it; the emulator
/// copies at once.
///
/// # Safety
/// 1. `dst` is a 16-byte-aligned `.shared::cta` address of 16 bytes that nothing reads or
///    writes until the copy's group has been waited for.
/// 2. `src` is 16-byte aligned and its first `src_size` bytes (at most 16) are readable
///    global memory that no thread writes during the kernel.
#[inline(always)]
pub unsafe fn cp_async_cg_shared_global_16(dst: u32, src: *const [u32; 4], src_size: u32) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) dst, s = in(reg64) src, n = in(reg32) src_size, options(nostack)),
        emulator: emu::cp_async_16(dst, src, src_size),
    }
}

/// `cp.async.commit_group`: closes the group of this thread's `cp.async`s issued since the last.
#[inline(always)]
pub fn cp_async_commit_group() {
    gpu_or_emulator! {
        // SAFETY: bookkeeping of this thread's copies only.
        gpu: unsafe { ptx!("cp.async.commit_group;", options(nostack)) },
        emulator: (),
    }
}

/// `cp.async.wait_group N`: waits until at most `N` of this thread's committed groups are
/// pending. Other threads' copies need a barrier after it as well.
#[inline(always)]
pub fn cp_async_wait_group<const N: u32>() {
    gpu_or_emulator! {
        // SAFETY: waits only; the memory clobber keeps shared accesses after it.
        gpu: unsafe { ptx!("cp.async.wait_group {n};", n = const N, options(nostack)) },
        emulator: (),
    }
}

// --- Warpgroup tensor cores (§9.7.15) and tensor copies (§9.7.9.27), sm_90a ------------------

/// `mbarrier.arrive.release.cta.shared::cta.b64`: one arrival at the barrier at `addr`.
///
/// # Safety
/// 1. `addr` is an initialised barrier in this block's shared memory.
#[inline(always)]
pub unsafe fn mbarrier_arrive_shared_b64(addr: u32) {
    gpu_or_emulator! {
        gpu: ptx!("{{ .reg .b64 state; mbarrier.arrive.release.cta.shared::cta.b64 state, [{a}]; }}", a = in(reg32) addr, options(nostack)),
        emulator: emu::mbarrier_arrive(addr),
    }
}

/// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes`: starts
/// loading the box at (column `c0`, row `c1`) of the tensor that the tensor map at `map`
/// describes into shared memory at `dst`, zero-filling what lies outside the tensor; the box's
/// bytes (all of them, filled or not) complete on the barrier at `barrier`.
///
/// # Safety
/// 1. `map` is the generic address of a tensor map (`cuTensorMapEncodeTiled`; on the
///    emulator, `Gpu::tensor_map_2d`'s) in global memory, 64-byte aligned, that nothing
///    writes during the kernel, describing a live tensor that nothing writes either.
/// 2. `dst` is a `.shared::cta` address of this block with room for the box, aligned to 128
///    bytes (512 or 1024 with the 64- or 128-byte swizzle), that nothing touches until the barrier's phase
///    completes; `barrier` is an initialised barrier of this block whose current phase
///    expects these bytes ([`mbarrier_arrive_expect_tx_shared_b64`]).
#[inline(always)]
pub unsafe fn cp_async_bulk_tensor_2d_shared_global(dst: u32, map: *const [u64; 16], c0: i32, c1: i32, barrier: u32) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
                  d = in(reg32) dst, m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1, b = in(reg32) barrier, options(nostack)),
        emulator: emu::tensor::tma_load(dst, map, [c0, c1, 0], barrier),
    }
}

/// `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes`: as
/// [`cp_async_bulk_tensor_2d_shared_global`] for the box at (column `c0`, row `c1`, plane
/// `c2`) of a 3-D tensor, written plane after plane.
///
/// # Safety
/// As [`cp_async_bulk_tensor_2d_shared_global`] (on the emulator, `Gpu::tensor_map_3d`'s map).
#[inline(always)]
pub unsafe fn cp_async_bulk_tensor_3d_shared_global(dst: u32, map: *const [u64; 16], c0: i32, c1: i32, c2: i32, barrier: u32) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}];",
                  d = in(reg32) dst, m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1, z = in(reg32) c2, b = in(reg32) barrier, options(nostack)),
        emulator: emu::tensor::tma_load(dst, map, [c0, c1, c2], barrier),
    }
}

/// `cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint`:
/// as [`cp_async_bulk_tensor_3d_shared_global`], the lines it brings into L2 kept by the
/// eviction `policy` ([`createpolicy_l2_evict_first`]).
///
/// # Safety
/// As [`cp_async_bulk_tensor_3d_shared_global`]; `policy` comes from a `createpolicy` of this
/// thread.
#[inline(always)]
pub unsafe fn cp_async_bulk_tensor_3d_shared_global_l2_hint(dst: u32, map: *const [u64; 16], c0: i32, c1: i32, c2: i32, barrier: u32, policy: u64) {
    gpu_or_emulator! {
        gpu: ptx!("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [{d}], [{m}, {{{x}, {y}, {z}}}], [{b}], {p};",
                  d = in(reg32) dst, m = in(reg64) map, x = in(reg32) c0, y = in(reg32) c1, z = in(reg32) c2, b = in(reg32) barrier,
                  p = in(reg64) policy, options(nostack)),
        emulator: {
            let _ = policy;
            emu::tensor::tma_load(dst, map, [c0, c1, c2], barrier)
        },
    }
}

/// The start-address field of a `wgmma` matrix descriptor for the `.shared::cta` address
/// `addr`: bits 0-13 hold `(addr & 0x3ffff) >> 4` (PTX ISA §9.7.15.5.1). The emulator also
/// keeps the address's shared window in reserved bits, which the GPU never sees.
#[inline(always)]
pub fn wgmma_descriptor_address(addr: u32) -> u64 {
    let field = u64::from((addr & 0x3ffff) >> 4);
    gpu_or_emulator! {
        gpu: field,
        emulator: field | u64::from(emu::memory::window_of(addr)) << emu::tensor::DESCRIPTOR_WINDOW_SHIFT,
    }
}

/// `wgmma.fence.sync.aligned`: orders this warpgroup's register accesses (the accumulators)
/// before the `wgmma.mma_async`s that follow. Every thread of the warpgroup executes it.
#[inline(always)]
pub fn wgmma_fence() {
    gpu_or_emulator! {
        // SAFETY: orders register and shared-memory accesses only.
        gpu: unsafe { ptx!("wgmma.fence.sync.aligned;", options(nostack)) },
        emulator: (),
    }
}

/// `wgmma.commit_group.sync.aligned`: closes the group of this warpgroup's `wgmma.mma_async`s
/// issued since the last.
#[inline(always)]
pub fn wgmma_commit_group() {
    gpu_or_emulator! {
        // SAFETY: bookkeeping of this warpgroup's operations only.
        gpu: unsafe { ptx!("wgmma.commit_group.sync.aligned;", options(nostack)) },
        emulator: (),
    }
}

/// `wgmma.wait_group.sync.aligned N`: waits until at most `N` of this warpgroup's committed
/// groups are pending; their accumulators are then readable and their shared-memory operands
/// free.
#[inline(always)]
pub fn wgmma_wait_group<const N: u32>() {
    gpu_or_emulator! {
        // SAFETY: waits only; the memory clobber keeps shared accesses after it.
        gpu: unsafe { ptx!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) },
        emulator: emu::warpgroup_wait(),
    }
}

macro_rules! setmaxnreg {
    ($($(#[$doc:meta])* $name:ident => $ptx:literal;)*) => {$(
        $(#[$doc])*
        ///
        /// Every thread of the warpgroup executes it; `N` is a multiple of 8 in 24..=256.
        #[inline(always)]
        pub fn $name<const N: u32>() {
            const { assert!(N % 8 == 0 && N >= 24 && N <= 256, "setmaxnreg takes a multiple of 8 in 24..=256") };
            gpu_or_emulator! {
                // SAFETY: changes the warpgroup's register allocation; the compiler allocates
                // registers for the whole kernel within the launch's budget.
                gpu: unsafe { ptx!(concat!($ptx, " {n};"), n = const N, options(nostack)) },
                emulator: (),
            }
        }
    )*};
}

setmaxnreg! {
    /// `setmaxnreg.inc.sync.aligned.u32 N`: raises the warpgroup's registers per thread to `N`
    /// (waiting until the SM has them).
    setmaxnreg_inc => "setmaxnreg.inc.sync.aligned.u32";
    /// `setmaxnreg.dec.sync.aligned.u32 N`: lowers the warpgroup's registers per thread to
    /// `N`, releasing the rest to the SM.
    setmaxnreg_dec => "setmaxnreg.dec.sync.aligned.u32";
}

/// `wgmma.mma_async` `$ptx` on `$d`'s accumulators, as asm operands `{0}` to `{R - 1}` (R
/// registers, listed `1 2 ... R-1` after `[$a_op $b_op $scale_op]`), then the descriptors `$a`,
/// `$b` and `$scale`'s predicate as operands R, R + 1 and R + 2.
#[cfg(target_arch = "nvptx64")]
macro_rules! wgmma_asm {
    ($ptx:literal, $d:ident, $a:expr, $b:expr, $scale:expr; [$a_op:literal $b_op:literal $scale_op:literal $($i:literal)*]) => {
        ptx!(concat!("{{ .reg .pred p; setp.ne.b32 p, {", $scale_op, "}, 0; ", $ptx, " {{{0}", $(", {", $i, "}",)* "}}, {", $a_op, "}, {", $b_op, "}, p, 1, 1, 0, 0; }}"),
             inout(reg32) $d[0], $(inout(reg32) $d[$i],)* in(reg64) $a, in(reg64) $b, in(reg32) $scale, options(nostack))
    };
}

/// The `wgmma.mma_async` wrappers of one shape, `$regs` f32 accumulators a thread; `$operands`
/// as `wgmma_asm` takes them.
macro_rules! wgmma_k16 {
    ($regs:literal, $operands:tt: $($(#[$doc:meta])* $name:ident => $ptx:literal, $kind:ident;)*) => {$(
        $(#[$doc])*
        ///
        /// # Safety
        /// 1. The descriptors describe shared memory of this block that holds the operands
        ///    and that nothing writes until the [`wgmma_wait_group`] covering it.
        /// 2. A [`wgmma_fence`] orders earlier accesses to `d` before it.
        #[inline(always)]
        pub unsafe fn $name(desc_a: u64, desc_b: u64, d: &mut [f32; $regs], accumulate: bool) {
            gpu_or_emulator! {
                gpu: wgmma_asm!($ptx, d, desc_a, desc_b, accumulate as u32; $operands),
                emulator: emu::tensor::wgmma_k16(emu::HalfKind::$kind, desc_a, desc_b, d, accumulate),
            }
        }
    )*};
}

wgmma_k16! {
    4, [4 5 6 1 2 3]:
    /// `wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16`: `D = A·Bᵀ + D` (or `A·Bᵀ`
    /// when `accumulate` is false) for bf16 A and B, f32 D.
    ///
    /// As [`wgmma_mma_async_m64n256k16_f32_bf16_bf16`] with B 8 × 16 and 4 accumulators
    /// per thread (columns `2 (t % 4) + v % 2`).
    wgmma_mma_async_m64n8k16_f32_bf16_bf16 => "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16", Bf16;
    /// `wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16`: as the bf16 form, f16 inputs.
    wgmma_mma_async_m64n8k16_f32_f16_f16 => "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16", F16;
}

wgmma_k16! {
    32, [32 33 34 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]:
    /// `wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16`: `D = A·Bᵀ + D` (or `A·Bᵀ`
    /// when `accumulate` is false) for bf16 A and B, f32 D.
    ///
    /// As [`wgmma_mma_async_m64n256k16_f32_bf16_bf16`] with B 64 × 16 and 32 accumulators
    /// per thread (columns `8j + ..` for `j` in 0..8).
    wgmma_mma_async_m64n64k16_f32_bf16_bf16 => "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16", Bf16;
    /// `wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16`: as the bf16 form, f16 inputs.
    wgmma_mma_async_m64n64k16_f32_f16_f16 => "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16", F16;
}

wgmma_k16! {
    128, [128 129 130 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95 96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111 112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127]:
    /// `wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16`: `D = A·Bᵀ + D` (or `A·Bᵀ`
    /// when `accumulate` is false) for bf16 A and B, f32 D.
    ///
    /// A warpgroup collective (`.sync.aligned`): the 128 threads of a warpgroup (warps
    /// `4i .. 4i + 4` of the block) execute it together, each with 128 accumulators in the
    /// layout of PTX ISA §9.7.15.5.1 (see [`crate::warpgroup`]); `A` (64 × 16) and `B`
    /// (256 × 16, i.e. Bᵀ) are K-major in shared memory as `desc_a`/`desc_b` describe
    /// them. Asynchronous: `d` is not to be read or written until a
    /// [`wgmma_wait_group`] after the [`wgmma_commit_group`] that follows it.
    wgmma_mma_async_m64n256k16_f32_bf16_bf16 => "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", Bf16;
    /// `wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16`: as the bf16 form, f16 inputs.
    wgmma_mma_async_m64n256k16_f32_f16_f16 => "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", F16;
}
