//! Shared memory: typed, bounds-checked views whose accesses compile to `ld.shared`/`st.shared`.
//!
//! Static arrays come from the `clusterfuse::shared!` macro (one per call site, per block,
//! like a CUDA `__shared__` variable); dynamic shared memory, sized at launch, is carved with
//! [`dynamic`]. Views are `Copy` handles to memory every thread of the block can reach, so
//! ordering between threads is the kernel's job: put a [`block::sync`](crate::block::sync)
//! between a store and another thread's load.

use crate::arch::{self, SharedWord};
use crate::{in_bounds, out_of_bounds, vector_in_bounds};
use core::marker::PhantomData;
use core::mem::size_of;

/// A view of `len` values of `T` in the block's shared memory.
#[derive(Clone, Copy)]
pub struct SharedSlice<T> {
    addr: u32,
    len: u32,
    _element: PhantomData<T>,
}

impl<T: SharedWord> SharedSlice<T> {
    /// A view of `len` values at 32-bit shared address `addr`.
    ///
    /// # Safety
    /// 1. `addr .. addr + len * size_of::<T>()` lies in this block's shared memory, aligned for `T`.
    /// 2. For the kernel's lifetime nothing else uses that memory as another type.
    #[inline(always)]
    pub unsafe fn from_raw_parts(addr: u32, len: usize) -> Self {
        Self { addr, len: len as u32, _element: PhantomData }
    }

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

    /// The 32-bit shared address of element 0 (for `mapa` and hand-written PTX).
    #[inline(always)]
    pub fn addr(self) -> u32 {
        self.addr
    }

    /// Element `i`; traps when `i >= len`.
    #[inline(always)]
    pub fn load(self, i: usize) -> T {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: `i` is in bounds (checked above) and the view's memory is shared (invariant).
        unsafe { self.load_unchecked(i) }
    }

    /// Stores `value` at element `i`; traps when `i >= len`.
    #[inline(always)]
    pub fn store(self, i: usize, value: T) {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: as for `load`.
        unsafe { self.store_unchecked(i, value) }
    }

    /// Element `i`, unchecked.
    ///
    /// # Safety
    /// 1. `i < self.len()`.
    #[inline(always)]
    pub unsafe fn load_unchecked(self, i: usize) -> T {
        T::ld_shared(self.addr + (i * size_of::<T>()) as u32)
    }

    /// Stores `value` at element `i`, unchecked.
    ///
    /// # Safety
    /// 1. `i < self.len()`.
    #[inline(always)]
    pub unsafe fn store_unchecked(self, i: usize, value: T) {
        T::st_shared(self.addr + (i * size_of::<T>()) as u32, value)
    }

    /// Elements `N * i .. N * i + N` in one 16-byte access (`ld.shared.v4`); `[T; N]` must
    /// be 16 bytes. Traps when out of bounds or misaligned.
    #[inline(always)]
    pub fn load16<const N: usize>(self, i: usize) -> [T; N] {
        let byte = self.vector_offset::<N>(i);
        // SAFETY: in bounds and 16-byte aligned (checked by `vector_offset`); `[T; N]` and
        // `[u32; 4]` are both 16 bytes of plain data.
        unsafe { core::mem::transmute_copy(&<[u32; 4]>::ld_shared(self.addr + byte)) }
    }

    /// Stores elements `N * i .. N * i + N` in one 16-byte access; see [`SharedSlice::load16`].
    #[inline(always)]
    pub fn store16<const N: usize>(self, i: usize, values: [T; N]) {
        let byte = self.vector_offset::<N>(i);
        // SAFETY: as for `load16`.
        unsafe { <[u32; 4]>::st_shared(self.addr + byte, core::mem::transmute_copy(&values)) }
    }

    #[inline(always)]
    fn vector_offset<const N: usize>(self, i: usize) -> u32 {
        const { assert!(N * size_of::<T>() == 16, "a 16-byte access needs N * size_of::<T>() == 16") };
        let byte = i.wrapping_mul(16) as u32;
        if !vector_in_bounds::<N>(i, self.len()) || !(self.addr + byte).is_multiple_of(16) {
            out_of_bounds()
        }
        byte
    }

    /// Starts copying elements `N * j .. N * j + N` of the kernel input `src` into elements
    /// `N * i .. N * i + N` of this slice, 16 bytes without a register round trip
    /// (`cp.async.cg`, through L2), so that a thread can have many in flight. The elements
    /// land at [`wait_async_copies`]; a block barrier after it shows them to the block.
    /// Traps when either side is out of bounds or misaligned.
    #[inline(always)]
    pub fn copy16_async<const N: usize>(self, i: usize, src: &[T], j: usize) {
        let from = crate::global::vector_ptr::<T, N>(src.as_ptr(), src.len(), j);
        let to = self.addr + self.vector_offset::<N>(i);
        // SAFETY: both sides are in bounds and 16-byte aligned (checked above); `src` is a
        // kernel input, which no thread writes during the kernel. Reading the destination
        // before the wait is a race on plain data, as any unsynchronised shared access is.
        unsafe { arch::cp_async_cg_shared_global_16(to, from.cast(), 16) }
    }

    /// Starts copying all of the kernel input `src` into the first `src.len()` elements of
    /// this slice in one asynchronous bulk copy (`cp.async.bulk`, global → shared, no
    /// registers), whose bytes complete on the mbarrier at `barrier`: the elements may be read
    /// once a wait for that phase returns. Traps unless both ends are 16-byte aligned, the
    /// size is a multiple of 16 bytes and it fits. See [`crate::tma::Pipeline::producer_acquire`].
    ///
    /// # Safety
    /// 1. `barrier` is an initialised mbarrier of this block whose current phase expects these
    ///    bytes (an `arrive.expect_tx` of them, made or to be made before the phase can end).
    /// 2. Nothing writes this slice's first `src.len()` elements until the phase completes.
    #[inline(always)]
    pub unsafe fn load_async(self, src: &[T], barrier: u32) {
        let bytes = core::mem::size_of_val(src);
        if src.len() > self.len() || !bytes.is_multiple_of(16) || !self.addr.is_multiple_of(16) || !(src.as_ptr() as usize).is_multiple_of(16) {
            out_of_bounds()
        }
        // SAFETY: checked above: aligned and in bounds; `src` is a kernel input, which no
        // thread writes during the kernel; the barrier and the destination are the caller's.
        unsafe { arch::cp_async_bulk_shared_cluster_global(self.addr, src.as_ptr().cast(), bytes as u32, barrier) }
    }

    /// The view of elements `start .. start + len`; traps when that exceeds this view.
    #[inline(always)]
    pub fn slice(self, start: usize, len: usize) -> Self {
        if !in_bounds(start, len, self.len()) {
            out_of_bounds()
        }
        Self { addr: self.addr + (start * size_of::<T>()) as u32, len: len as u32, _element: PhantomData }
    }
}

impl SharedSlice<f32> {
    /// `atom.shared.add.f32` on element `i`; returns the old value.
    #[inline(always)]
    pub fn atomic_add(self, i: usize, value: f32) -> f32 {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: in bounds (checked above).
        unsafe { arch::atom_shared_add_f32(self.addr + (i * 4) as u32, value) }
    }
}

impl SharedSlice<u32> {
    /// `atom.shared.add.u32` on element `i`; returns the old value.
    #[inline(always)]
    pub fn atomic_add(self, i: usize, value: u32) -> u32 {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: in bounds (checked above).
        unsafe { arch::atom_shared_add_u32(self.addr + (i * 4) as u32, value) }
    }

    /// `atom.shared.or.b32` on element `i`; returns the old value.
    #[inline(always)]
    pub fn atomic_or(self, i: usize, value: u32) -> u32 {
        if i >= self.len() {
            out_of_bounds()
        }
        // SAFETY: in bounds (checked above).
        unsafe { arch::atom_shared_or_b32(self.addr + (i * 4) as u32, value) }
    }
}

/// The launch's dynamic shared memory, handed out front to back by [`DynamicShared::take`].
pub struct DynamicShared {
    next: u32,
    end: u32,
}

/// Waits for this thread's [`SharedSlice::copy16_async`] copies (`cp.async.commit_group`,
/// `cp.async.wait_group 0`).
#[inline(always)]
pub fn wait_async_copies() {
    arch::cp_async_commit_group();
    arch::cp_async_wait_group::<0>();
}

/// The dynamic shared memory given to this launch (`dynamic_smem_bytes` in the launch config).
/// Every thread that calls it gets the same sequence of views for the same sequence of `take`s.
#[inline(always)]
pub fn dynamic() -> DynamicShared {
    let base = arch::dynamic_smem_base();
    DynamicShared { next: base, end: base + arch::dynamic_smem_size() }
}

impl DynamicShared {
    /// The next `len` values of `T`, 16-byte aligned; traps when the launch gave too little.
    #[inline(always)]
    pub fn take<T: SharedWord>(&mut self, len: usize) -> SharedSlice<T> {
        let start = self.next.next_multiple_of(16);
        // Compared in values, so that no byte count is truncated to 32 bits.
        if len > self.end.saturating_sub(start) as usize / size_of::<T>() {
            out_of_bounds()
        }
        let bytes = (len * size_of::<T>()) as u32;
        self.next = start + bytes;
        // SAFETY: `start .. start + bytes` lies inside this launch's dynamic shared memory
        // and no earlier `take` of this allocator covers it.
        unsafe { SharedSlice::from_raw_parts(start, len) }
    }

    /// Skips to the next multiple of `align` bytes (a power of two), e.g. 1024 for tiles that
    /// TMA writes with the 128-byte swizzle.
    #[inline(always)]
    pub fn align_to(&mut self, align: u32) {
        self.next = self.next.next_multiple_of(align);
    }

    /// Bytes not yet taken.
    #[inline(always)]
    pub fn remaining_bytes(&self) -> usize {
        self.end.saturating_sub(self.next) as usize
    }
}
