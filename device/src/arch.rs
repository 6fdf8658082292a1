//! One `#[inline(always)]` function per PTX instruction or special register, named after it.
//!
//! This is the bottom layer: every higher module (`warp`, `block`, `shared`, `cluster`, ...)
//! is built from these, and users may build their own primitives from them too. Shared-memory
//! addresses are 32-bit addresses in the `.shared` window (what `mov.u32 r, sym;` and `mapa`
//! produce), so that loads and stores compile to `LDS`/`STS`, not generic `LD`/`ST`.
//!
//! Reference: PTX ISA 8.x, <https://docs.nvidia.com/cuda/parallel-thread-execution/>.

// Off the GPU the instructions do not exist: `ptx!` then diverges through `on_host`, so that
// code above this layer type-checks on the host (where the kernel crate's launchers are
// built) and fails loudly if it is ever run there. This is the one seam a CPU backend plugs into.
#![cfg_attr(not(target_arch = "nvptx64"), allow(unreachable_code, unused_unsafe, unused_variables, unused_mut, unused_assignments))]

#[cfg(target_arch = "nvptx64")]
macro_rules! ptx {
    ($($asm:tt)*) => { core::arch::asm!($($asm)*) };
}

#[cfg(not(target_arch = "nvptx64"))]
macro_rules! ptx {
    ($template:expr $(, $($rest:tt)*)?) => { $crate::arch::on_host($template) };
}

/// What `shared!` reads on the host: there is no shared memory to point into.
#[cfg(not(target_arch = "nvptx64"))]
pub fn shared_array_address_on_host() -> u32 {
    on_host("shared!")
}

/// Reports GPU code run on the host: a kernel body or device helper called outside a launch.
#[cfg(not(target_arch = "nvptx64"))]
#[cold]
pub fn on_host(instruction: &str) -> ! {
    panic!("`{instruction}` is a GPU instruction: device code ran on the host; launch the kernel on a GPU")
}

// --- Special registers (PTX ISA §10) ---------------------------------------------------------

macro_rules! special_register_u32 {
    ($($(#[$doc:meta])* $name:ident => $reg:literal;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name() -> u32 {
            let value: u32;
            // SAFETY: reading a special register has no side effects.
            unsafe { ptx!(concat!("mov.u32 {v}, ", $reg, ";"), v = out(reg32) value, options(pure, nomem, nostack)) };
            value
        }
    )*};
}

special_register_u32! {
    /// `%tid.x`: the thread's index in its block.
    tid_x => "%tid.x";
    /// `%tid.y`.
    tid_y => "%tid.y";
    /// `%tid.z`.
    tid_z => "%tid.z";
    /// `%ntid.x`: the block's extent.
    ntid_x => "%ntid.x";
    /// `%ntid.y`.
    ntid_y => "%ntid.y";
    /// `%ntid.z`.
    ntid_z => "%ntid.z";
    /// `%ctaid.x`: the block's index in the grid.
    ctaid_x => "%ctaid.x";
    /// `%ctaid.y`.
    ctaid_y => "%ctaid.y";
    /// `%ctaid.z`.
    ctaid_z => "%ctaid.z";
    /// `%nctaid.x`: the grid's extent in blocks.
    nctaid_x => "%nctaid.x";
    /// `%nctaid.y`.
    nctaid_y => "%nctaid.y";
    /// `%nctaid.z`.
    nctaid_z => "%nctaid.z";
    /// `%laneid`: the thread's lane in its warp.
    laneid => "%laneid";
    /// `%dynamic_smem_size`: bytes of dynamic shared memory given to this launch.
    dynamic_smem_size => "%dynamic_smem_size";
    /// `%cluster_ctarank`: the block's rank in its cluster.
    cluster_ctarank => "%cluster_ctarank";
    /// `%cluster_nctarank`: blocks in the cluster.
    cluster_nctarank => "%cluster_nctarank";
    /// `%clusterid.x`: the cluster's index in the grid.
    clusterid_x => "%clusterid.x";
    /// `%clusterid.y`.
    clusterid_y => "%clusterid.y";
    /// `%clusterid.z`.
    clusterid_z => "%clusterid.z";
    /// `%nclusterid.x`: the grid's extent in clusters.
    nclusterid_x => "%nclusterid.x";
    /// `%cluster_nctaid.x`: the cluster's extent in blocks.
    cluster_nctaid_x => "%cluster_nctaid.x";
    /// `%cluster_nctaid.y`.
    cluster_nctaid_y => "%cluster_nctaid.y";
    /// `%cluster_nctaid.z`.
    cluster_nctaid_z => "%cluster_nctaid.z";
    /// `%cluster_ctaid.x`: the block's index in its cluster.
    cluster_ctaid_x => "%cluster_ctaid.x";
    /// `%cluster_ctaid.y`.
    cluster_ctaid_y => "%cluster_ctaid.y";
    /// `%cluster_ctaid.z`.
    cluster_ctaid_z => "%cluster_ctaid.z";
}

// The kernel's dynamic shared memory: one module-scope symbol, sized by each launch.
#[cfg(target_arch = "nvptx64")]
core::arch::global_asm!(".extern .shared .align 16 .b8 __clusterfuse_dynamic_smem[];");

/// The 32-bit shared address where the launch's dynamic shared memory starts.
#[inline(always)]
pub fn dynamic_smem_base() -> u32 {
    let base: u32;
    // SAFETY: reads the address of a symbol.
    unsafe { ptx!("mov.u32 {b}, __clusterfuse_dynamic_smem;", b = out(reg32) base, options(pure, nomem, nostack)) };
    base
}

/// `%clock64`: the multiprocessor's cycle counter.
#[inline(always)]
pub fn clock64() -> u64 {
    let value: u64;
    // SAFETY: reading a special register has no side effects; `volatile` (no `pure`) so that
    // successive reads are not merged.
    unsafe { ptx!("mov.u64 {v}, %clock64;", v = out(reg64) value, options(nomem, nostack)) };
    value
}

// --- Barriers and fences (§9.7.13) -----------------------------------------------------------

/// `bar.sync 0`: waits until every thread of the block arrives; orders shared and global
/// memory among them (CUDA's `__syncthreads`).
#[inline(always)]
pub fn bar_sync() {
    // SAFETY: a barrier has no memory-safety preconditions (a barrier that some threads
    // never reach hangs the block; that is a liveness bug, not undefined behaviour in Rust).
    unsafe { ptx!("bar.sync 0;", options(nostack)) };
}

/// `bar.warp.sync mask`: synchronises the warp's lanes named in `mask` (CUDA's `__syncwarp`).
#[inline(always)]
pub fn bar_warp_sync(mask: u32) {
    // SAFETY: as for `bar_sync`.
    unsafe { ptx!("bar.warp.sync {m};", m = in(reg32) mask, options(nostack)) };
}

/// `fence.acq_rel.cta`.
#[inline(always)]
pub fn fence_acq_rel_cta() {
    // SAFETY: a fence only orders memory operations.
    unsafe { ptx!("fence.acq_rel.cta;", options(nostack)) };
}

/// `fence.acq_rel.gpu`.
#[inline(always)]
pub fn fence_acq_rel_gpu() {
    // SAFETY: a fence only orders memory operations.
    unsafe { ptx!("fence.acq_rel.gpu;", options(nostack)) };
}

/// `barrier.cluster.arrive.release`: this thread has arrived at the cluster barrier; its
/// earlier writes (shared, distributed shared, global) are released to the cluster.
#[inline(always)]
pub fn barrier_cluster_arrive_release() {
    // SAFETY: a barrier arrival has no memory-safety preconditions.
    unsafe { ptx!("barrier.cluster.arrive.release;", options(nostack)) };
}

/// `barrier.cluster.arrive.relaxed`: arrival without release ordering (cheaper; pair with a
/// fence when writes must be visible).
#[inline(always)]
pub fn barrier_cluster_arrive_relaxed() {
    // SAFETY: as above.
    unsafe { ptx!("barrier.cluster.arrive.relaxed;", options(nostack)) };
}

/// `barrier.cluster.wait.acquire`: waits until every thread of every block in the cluster
/// has arrived; acquires what they released.
#[inline(always)]
pub fn barrier_cluster_wait_acquire() {
    // SAFETY: as above.
    unsafe { ptx!("barrier.cluster.wait.acquire;", options(nostack)) };
}

/// `fence.acq_rel.cluster`.
#[inline(always)]
pub fn fence_acq_rel_cluster() {
    // SAFETY: a fence only orders memory operations.
    unsafe { ptx!("fence.acq_rel.cluster;", options(nostack)) };
}

/// `mapa.shared::cluster.u32`: the distributed-shared address of the variable at shared
/// address `addr` in the block of cluster rank `rank`.
#[inline(always)]
pub fn mapa_shared_cluster(addr: u32, rank: u32) -> u32 {
    let out: u32;
    // SAFETY: address arithmetic only; using the result is what needs care.
    unsafe { ptx!("mapa.shared::cluster.u32 {o}, {a}, {r};", o = out(reg32) out, a = in(reg32) addr, r = in(reg32) rank, options(pure, nomem, nostack)) };
    out
}

// --- Warp shuffles and votes (§9.7.8.6, §9.7.8.7) -------------------------------------------

/// `shfl.sync.bfly.b32`: the value of lane `laneid ^ lane_mask`.
#[inline(always)]
pub fn shfl_sync_bfly_b32(value: u32, lane_mask: u32, member_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: a shuffle reads registers of lanes in `member_mask` only.
    unsafe {
        ptx!("shfl.sync.bfly.b32 {o}, {v}, {l}, 0x1f, {m};",
             o = out(reg32) out, v = in(reg32) value, l = in(reg32) lane_mask,
             m = in(reg32) member_mask, options(nomem, nostack))
    };
    out
}

/// `shfl.sync.down.b32`: the value of lane `laneid + delta` (own value past the warp's end).
#[inline(always)]
pub fn shfl_sync_down_b32(value: u32, delta: u32, member_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: as for `shfl_sync_bfly_b32`.
    unsafe {
        ptx!("shfl.sync.down.b32 {o}, {v}, {d}, 0x1f, {m};",
             o = out(reg32) out, v = in(reg32) value, d = in(reg32) delta,
             m = in(reg32) member_mask, options(nomem, nostack))
    };
    out
}

/// `shfl.sync.up.b32`: the value of lane `laneid - delta` (own value before lane 0).
#[inline(always)]
pub fn shfl_sync_up_b32(value: u32, delta: u32, member_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: as for `shfl_sync_bfly_b32`.
    unsafe {
        ptx!("shfl.sync.up.b32 {o}, {v}, {d}, 0, {m};",
             o = out(reg32) out, v = in(reg32) value, d = in(reg32) delta,
             m = in(reg32) member_mask, options(nomem, nostack))
    };
    out
}

/// `shfl.sync.idx.b32`: the value of lane `src_lane`.
#[inline(always)]
pub fn shfl_sync_idx_b32(value: u32, src_lane: u32, member_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: as for `shfl_sync_bfly_b32`.
    unsafe {
        ptx!("shfl.sync.idx.b32 {o}, {v}, {s}, 0x1f, {m};",
             o = out(reg32) out, v = in(reg32) value, s = in(reg32) src_lane,
             m = in(reg32) member_mask, options(nomem, nostack))
    };
    out
}

/// `vote.sync.ballot.b32`: bit `i` set when lane `i`'s predicate is true.
#[inline(always)]
pub fn vote_sync_ballot_b32(predicate: bool, member_mask: u32) -> u32 {
    let out: u32;
    // SAFETY: a vote reads predicates of lanes in `member_mask` only.
    unsafe {
        ptx!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {o}, p, {m}; }}",
             o = out(reg32) out, x = in(reg32) predicate as u32, m = in(reg32) member_mask,
             options(nomem, nostack))
    };
    out
}

// --- Shared memory (§9.7.9.8, §9.7.9.9) ------------------------------------------------------

/// A type that `ld.shared`/`st.shared` (and their `::cluster` forms) move in one instruction.
///
/// # Safety
/// `PTX_TYPE` must name a PTX type of exactly `size_of::<Self>()` bytes, and `to_bits` /
/// `from_bits` must be exact inverses.
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
                let bits: $bits;
                ptx!(concat!("ld.shared.", $ptx, " {v}, [{a}];"), v = out($reg) bits, a = in(reg32) addr,
                     options(readonly, nostack));
                Self::from_bits(bits)
            }
            #[inline(always)]
            unsafe fn st_shared(addr: u32, value: Self) {
                ptx!(concat!("st.shared.", $ptx, " [{a}], {v};"), a = in(reg32) addr, v = in($reg) value.to_bits(),
                     options(nostack));
            }
            #[inline(always)]
            unsafe fn ld_shared_cluster(addr: u32) -> Self {
                let bits: $bits;
                ptx!(concat!("ld.shared::cluster.", $ptx, " {v}, [{a}];"), v = out($reg) bits, a = in(reg32) addr,
                     options(readonly, nostack));
                Self::from_bits(bits)
            }
            #[inline(always)]
            unsafe fn st_shared_cluster(addr: u32, value: Self) {
                ptx!(concat!("st.shared::cluster.", $ptx, " [{a}], {v};"), a = in(reg32) addr, v = in($reg) value.to_bits(),
                     options(nostack));
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

// SAFETY: `.v4.b32` moves 16 bytes, the size of `[u32; 4]`.
unsafe impl SharedWord for [u32; 4] {
    type Bits = [u32; 4];
    #[inline(always)]
    fn to_bits(self) -> [u32; 4] { self }
    #[inline(always)]
    fn from_bits(bits: [u32; 4]) -> Self { bits }
    #[inline(always)]
    unsafe fn ld_shared(addr: u32) -> Self {
        let v: [u32; 4] = [0; 4];
        let [mut a, mut b, mut c, mut d] = v;
        ptx!("ld.shared.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b,
             c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr, options(readonly, nostack));
        [a, b, c, d]
    }
    #[inline(always)]
    unsafe fn st_shared(addr: u32, value: Self) {
        ptx!("st.shared.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg32) addr, a = in(reg32) value[0],
             b = in(reg32) value[1], c = in(reg32) value[2], d = in(reg32) value[3], options(nostack));
    }
    #[inline(always)]
    unsafe fn ld_shared_cluster(addr: u32) -> Self {
        let v: [u32; 4] = [0; 4];
        let [mut a, mut b, mut c, mut d] = v;
        ptx!("ld.shared::cluster.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b,
             c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr, options(readonly, nostack));
        [a, b, c, d]
    }
    #[inline(always)]
    unsafe fn st_shared_cluster(addr: u32, value: Self) {
        ptx!("st.shared::cluster.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg32) addr, a = in(reg32) value[0],
             b = in(reg32) value[1], c = in(reg32) value[2], d = in(reg32) value[3], options(nostack));
    }
}

/// `cvta.shared.u64`: a generic pointer to a 32-bit shared address (for APIs that want one).
#[inline(always)]
pub fn cvta_shared(addr: u32) -> u64 {
    let out: u64;
    // SAFETY: address arithmetic only.
    unsafe { ptx!("{{ .reg .u64 t; cvt.u64.u32 t, {a}; cvta.shared.u64 {o}, t; }}", o = out(reg64) out, a = in(reg32) addr, options(pure, nomem, nostack)) };
    out
}

/// `atom.shared.add.f32`; returns the old value.
///
/// # Safety
/// 1. `addr` is a `.shared::cta` address of a live, 4-byte-aligned `f32`.
#[inline(always)]
pub unsafe fn atom_shared_add_f32(addr: u32, value: f32) -> f32 {
    let old: f32;
    ptx!("atom.shared.add.f32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg32) addr, v = in(reg32) value, options(nostack));
    old
}

/// `atom.shared.add.u32`; returns the old value.
///
/// # Safety
/// 1. `addr` is a `.shared::cta` address of a live, 4-byte-aligned `u32`.
#[inline(always)]
pub unsafe fn atom_shared_add_u32(addr: u32, value: u32) -> u32 {
    let old: u32;
    ptx!("atom.shared.add.u32 {o}, [{a}], {v};", o = out(reg32) old, a = in(reg32) addr, v = in(reg32) value, options(nostack));
    old
}

// --- Global memory (§9.7.9.8, §9.7.13.5) -----------------------------------------------------

/// `ld.global.nc.v4.b32`: 16 bytes through the read-only path.
///
/// # Safety
/// 1. `ptr` is a 16-byte-aligned global address of 16 readable bytes that no thread writes
///    during the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_v4_b32(ptr: *const [u32; 4]) -> [u32; 4] {
    let v: [u32; 4] = [0; 4];
    let [mut a, mut b, mut c, mut d] = v;
    ptx!("ld.global.nc.v4.b32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b,
         c = out(reg32) c, d = out(reg32) d, p = in(reg64) ptr, options(readonly, nostack, pure));
    [a, b, c, d]
}

/// `st.global.v4.b32`: 16 bytes in one store.
///
/// # Safety
/// 1. `ptr` is a 16-byte-aligned global address of 16 writable bytes.
#[inline(always)]
pub unsafe fn st_global_v4_b32(ptr: *mut [u32; 4], value: [u32; 4]) {
    ptx!("st.global.v4.b32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg64) ptr, a = in(reg32) value[0],
         b = in(reg32) value[1], c = in(reg32) value[2], d = in(reg32) value[3], options(nostack));
}

/// `atom.global.add.f32`; returns the old value.
///
/// # Safety
/// 1. `ptr` is a 4-byte-aligned global address of a live `f32`.
#[inline(always)]
pub unsafe fn atom_global_add_f32(ptr: *mut f32, value: f32) -> f32 {
    let old: f32;
    ptx!("atom.global.add.f32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack));
    old
}

/// `atom.global.add.u32`; returns the old value.
///
/// # Safety
/// 1. `ptr` is a 4-byte-aligned global address of a live `u32`.
#[inline(always)]
pub unsafe fn atom_global_add_u32(ptr: *mut u32, value: u32) -> u32 {
    let old: u32;
    ptx!("atom.global.add.u32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack));
    old
}

/// `atom.global.max.s32`; returns the old value.
///
/// # Safety
/// 1. `ptr` is a 4-byte-aligned global address of a live `i32`.
#[inline(always)]
pub unsafe fn atom_global_max_s32(ptr: *mut i32, value: i32) -> i32 {
    let old: i32;
    ptx!("atom.global.max.s32 {o}, [{p}], {v};", o = out(reg32) old, p = in(reg64) ptr, v = in(reg32) value, options(nostack));
    old
}

// --- Arithmetic (§9.7.3) ---------------------------------------------------------------------

/// `fma.rn.f32`: `a * b + c` with one rounding.
#[inline(always)]
pub fn fma_rn_f32(a: f32, b: f32, c: f32) -> f32 {
    let d: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b, c = in(reg32) c, options(pure, nomem, nostack)) };
    d
}

/// `ex2.approx.ftz.f32`: `2^x`, about 2 ulp.
#[inline(always)]
pub fn ex2_approx_ftz_f32(x: f32) -> f32 {
    let y: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("ex2.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `rsqrt.approx.ftz.f32`: `1 / sqrt(x)`, about 2 ulp.
#[inline(always)]
pub fn rsqrt_approx_ftz_f32(x: f32) -> f32 {
    let y: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("rsqrt.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `rcp.approx.ftz.f32`: `1 / x`, about 1 ulp.
#[inline(always)]
pub fn rcp_approx_ftz_f32(x: f32) -> f32 {
    let y: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("rcp.approx.ftz.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `tanh.approx.f32` (sm_75+): maximum relative error about 2^-11.
#[inline(always)]
pub fn tanh_approx_f32(x: f32) -> f32 {
    let y: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("tanh.approx.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `sqrt.rn.f32`: correctly rounded square root.
#[inline(always)]
pub fn sqrt_rn_f32(x: f32) -> f32 {
    let y: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("sqrt.rn.f32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

macro_rules! half_op {
    ($($(#[$doc:meta])* $name:ident($($arg:ident),*) => $ptx:literal;)*) => {$(
        $(#[$doc])*
        #[inline(always)]
        pub fn $name($($arg: u16),*) -> u16 {
            let d: u16;
            // SAFETY: arithmetic only.
            unsafe { ptx!(concat!($ptx, " {d}, ", half_op!(@ops $($arg),*), ";"), d = out(reg16) d, $($arg = in(reg16) $arg),*, options(pure, nomem, nostack)) };
            d
        }
    )*};
    (@ops $a:ident) => { "{a}" };
    (@ops $a:ident, $b:ident) => { "{a}, {b}" };
    (@ops $a:ident, $b:ident, $c:ident) => { "{a}, {b}, {c}" };
}

half_op! {
    /// `add.rn.f16` on raw bits.
    add_rn_f16(a, b) => "add.rn.f16";
    /// `mul.rn.f16` on raw bits.
    mul_rn_f16(a, b) => "mul.rn.f16";
    /// `fma.rn.f16` on raw bits.
    fma_rn_f16(a, b, c) => "fma.rn.f16";
    /// `add.rn.bf16` (sm_90) on raw bits.
    add_rn_bf16(a, b) => "add.rn.bf16";
    /// `mul.rn.bf16` (sm_90) on raw bits.
    mul_rn_bf16(a, b) => "mul.rn.bf16";
    /// `fma.rn.bf16` (sm_80) on raw bits.
    fma_rn_bf16(a, b, c) => "fma.rn.bf16";
}

/// `cvt.rn.bf16.f32`: rounds to the nearest bf16 (raw bits).
#[inline(always)]
pub fn cvt_rn_bf16_f32(x: f32) -> u16 {
    let y: u16;
    // SAFETY: arithmetic only.
    unsafe { ptx!("cvt.rn.bf16.f32 {y}, {x};", y = out(reg16) y, x = in(reg32) x, options(pure, nomem, nostack)) };
    y
}

/// `cvt.f32.bf16`: widens a bf16 (raw bits), exactly.
#[inline(always)]
pub fn cvt_f32_bf16(x: u16) -> f32 {
    let y: f32;
    // SAFETY: arithmetic only.
    unsafe { ptx!("cvt.f32.bf16 {y}, {x};", y = out(reg32) y, x = in(reg16) x, options(pure, nomem, nostack)) };
    y
}

/// `trap`: aborts the kernel; the launch fails with `CUDA_ERROR_ILLEGAL_INSTRUCTION`.
#[inline(always)]
pub fn trap() -> ! {
    // SAFETY: `trap` ends the kernel.
    unsafe { ptx!("trap;", options(noreturn, nostack)) }
}
