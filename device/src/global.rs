//! Global memory: kernel outputs and 16-byte vector accesses.
//!
//! Kernel inputs are ordinary `&[T]`. Outputs are [`Out`]: every thread of the grid holds
//! one, so it hands out no `&mut`; threads write through `set` and must not write the same
//! element without ordering (a data race, as in CUDA).

use crate::{arch, in_bounds, out_of_bounds, vector_in_bounds};
use core::marker::PhantomData;
use core::mem::{size_of, size_of_val};

/// A kernel's output buffer in global memory: `len` values of `T` that every thread may write.
pub struct Out<'a, T> {
    ptr: *mut T,
    len: usize,
    _buffer: PhantomData<&'a mut [T]>,
}

impl<'a, T: Copy> Out<'a, T> {
    /// An output over `len` values at `ptr`.
    ///
    /// # Safety
    /// 1. `ptr .. ptr + len` is device memory, aligned for `T`, writable for `'a`.
    /// 2. No `&[T]` to that memory is alive for `'a` (inputs may be read through the read-only
    ///    path, [`load16_invariant`]).
    #[inline(always)]
    pub unsafe fn from_raw_parts(ptr: *mut T, len: usize) -> Self {
        Self { ptr, len, _buffer: PhantomData }
    }

    /// Number of elements.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the buffer holds no elements.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device pointer, for hand-written PTX.
    #[inline(always)]
    pub fn as_mut_ptr(&self) -> *mut T {
        self.ptr
    }

    /// Element `i`; traps when `i >= len`.
    #[inline(always)]
    pub fn get(&self, i: usize) -> T {
        if i >= self.len {
            out_of_bounds()
        }
        // SAFETY: in bounds; the memory is readable (invariant 1).
        unsafe { self.ptr.add(i).read() }
    }

    /// Stores `value` at element `i`; traps when `i >= len`.
    #[inline(always)]
    pub fn set(&self, i: usize, value: T) {
        if i >= self.len {
            out_of_bounds()
        }
        // SAFETY: in bounds; the memory is writable (invariant 1).
        unsafe { self.ptr.add(i).write(value) }
    }

    /// Stores `value` at element `i`, unchecked.
    ///
    /// # Safety
    /// 1. `i < self.len()`.
    #[inline(always)]
    pub unsafe fn set_unchecked(&self, i: usize, value: T) {
        self.ptr.add(i).write(value)
    }

    /// Stores elements `i` and `i + 1` of a 2-byte `T` in one 4-byte store. Traps when out of
    /// bounds or not 4-byte aligned.
    #[inline(always)]
    pub fn store_pair(&self, i: usize, values: [T; 2]) {
        const { assert!(size_of::<T>() == 2, "a pair store moves two 2-byte values") };
        let ptr = self.ptr.wrapping_add(i);
        if !in_bounds(i, 2, self.len) || !(ptr as usize).is_multiple_of(4) {
            out_of_bounds()
        }
        // SAFETY: in bounds and 4-byte aligned (checked above).
        unsafe { self.store_pair_unchecked(i, values) }
    }

    /// [`Out::store_pair`] without its checks, for a caller that checked a whole tile once.
    ///
    /// # Safety
    /// 1. `i + 2 <= self.len()`.
    /// 2. Element `i` is 4-byte aligned.
    #[inline(always)]
    pub unsafe fn store_pair_unchecked(&self, i: usize, values: [T; 2]) {
        const { assert!(size_of::<T>() == 2, "a pair store moves two 2-byte values") };
        // The memory is writable (invariant 1); `[T; 2]` is 4 bytes of plain data.
        (self.ptr.add(i) as *mut u32).write(core::mem::transmute_copy(&values))
    }

    /// Stores elements `N * i .. N * i + N` in one 16-byte `st.global.v4`; `[T; N]` must be
    /// 16 bytes. Traps when out of bounds or misaligned.
    #[inline(always)]
    pub fn store16<const N: usize>(&self, i: usize, values: [T; N]) {
        let ptr = vector_ptr::<T, N>(self.ptr, self.len, i);
        // SAFETY: in bounds and 16-byte aligned (checked by `vector_ptr`); `[T; N]` is 16
        // bytes of plain data.
        unsafe { arch::st_global_v4_b32(ptr as *mut [u32; 4], core::mem::transmute_copy(&values)) }
    }

    /// Elements `N * i .. N * i + N` in one 16-byte `ld.global.v4` through the coherent path
    /// (an output may be read back where this kernel, ordered by a barrier or fence, wrote it).
    /// Traps when out of bounds or misaligned.
    #[inline(always)]
    pub fn load16<const N: usize>(&self, i: usize) -> [T; N] {
        #[repr(C, align(16))]
        struct Vector([u32; 4]);
        let ptr = vector_ptr::<T, N>(self.ptr, self.len, i);
        // SAFETY: in bounds and 16-byte aligned (checked by `vector_ptr`); the memory is
        // readable (invariant 1); `[T; N]` is 16 bytes of plain data.
        unsafe { core::mem::transmute_copy(&(ptr as *const Vector).read().0) }
    }
}

/// Global memory a kernel reads through the coherent path, where another block or an earlier
/// kernel may have written it: an [`Out`] (ordered by a barrier or the kernel boundary) or a
/// published range a block waited for ([`Ready`](crate::grid::Ready)). Code generic over it
/// serves a kernel of a chain and the same stage in a persistent kernel.
pub trait Coherent<T: Copy> {
    /// Element `i`; traps outside what may be read.
    fn get(&self, i: usize) -> T;
    /// Elements `N * i .. N * i + N` in one 16-byte load; traps outside what may be read.
    fn load16<const N: usize>(&self, i: usize) -> [T; N];
}

impl<T: Copy> Coherent<T> for Out<'_, T> {
    #[inline(always)]
    fn get(&self, i: usize) -> T {
        Out::get(self, i)
    }

    #[inline(always)]
    fn load16<const N: usize>(&self, i: usize) -> [T; N] {
        Out::load16(self, i)
    }
}

impl<T: Copy, C: Coherent<T>> Coherent<T> for &C {
    #[inline(always)]
    fn get(&self, i: usize) -> T {
        (**self).get(i)
    }

    #[inline(always)]
    fn load16<const N: usize>(&self, i: usize) -> [T; N] {
        (**self).load16(i)
    }
}

impl Out<'_, crate::f16> {
    /// Rounds `values` to f16 in pairs (`cvt.rn.f16x2.f32`) and stores them as elements
    /// `8 i .. 8 i + 8` in one 16-byte `st.global.v4`. Traps when out of bounds or misaligned.
    #[inline(always)]
    pub fn store16_rounded(&self, i: usize, values: [f32; 8]) {
        vector_ptr::<crate::f16, 8>(self.ptr, self.len, i);
        // SAFETY: in bounds and 16-byte aligned (checked by `vector_ptr`).
        unsafe { self.store16_rounded_unchecked(i, values) }
    }

    /// [`Out::store16_rounded`] without its checks, for a caller that checked a whole run of
    /// vectors once.
    ///
    /// # Safety
    /// 1. `8 (i + 1) <= self.len()`.
    /// 2. The buffer starts at a 16-byte-aligned address.
    #[inline(always)]
    pub unsafe fn store16_rounded_unchecked(&self, i: usize, values: [f32; 8]) {
        let pair = |k: usize| arch::cvt_rn_f16x2_f32(values[2 * k + 1], values[2 * k]);
        arch::st_global_v4_b32(self.ptr.add(8 * i) as *mut [u32; 4], [pair(0), pair(1), pair(2), pair(3)])
    }
}

impl Out<'_, f32> {
    /// `atom.global.add.f32` on element `i`; returns the old value. Float atomics make the
    /// result depend on the order threads arrive in: prefer a reduction where determinism matters.
    #[inline(always)]
    pub fn atomic_add(&self, i: usize, value: f32) -> f32 {
        if i >= self.len {
            out_of_bounds()
        }
        // SAFETY: in bounds.
        unsafe { arch::atom_global_add_f32(self.ptr.add(i), value) }
    }
}

impl Out<'_, u32> {
    /// `atom.global.add.u32` on element `i`; returns the old value.
    #[inline(always)]
    pub fn atomic_add(&self, i: usize, value: u32) -> u32 {
        if i >= self.len {
            out_of_bounds()
        }
        // SAFETY: in bounds.
        unsafe { arch::atom_global_add_u32(self.ptr.add(i), value) }
    }
}

impl Out<'_, i32> {
    /// `atom.global.max.s32` on element `i`; returns the old value.
    #[inline(always)]
    pub fn atomic_max(&self, i: usize, value: i32) -> i32 {
        if i >= self.len {
            out_of_bounds()
        }
        // SAFETY: in bounds.
        unsafe { arch::atom_global_max_s32(self.ptr.add(i), value) }
    }
}

/// Traps unless the `len` elements at `ptr` start 16-byte aligned and hold 16-byte vectors of
/// `N` elements `0 .. end`: one check of a run of vectors (a row, say), after which
/// [`load16_unchecked`] and [`Out::store16_rounded_unchecked`] of any vector `i < end` are sound
/// (`end` computed without wrapping: a run's start that wrapped is not seen here).
#[inline(always)]
pub fn check16<T, const N: usize>(ptr: *const T, len: usize, end: usize) {
    const { assert!(N * size_of::<T>() == 16, "a 16-byte access needs N * size_of::<T>() == 16") };
    // Not `end > len / N`: equal, but that form made `layernorm_gelu_warps` spill at 64 registers.
    if (end > 0 && !vector_in_bounds::<N>(end - 1, len)) || !(ptr as usize).is_multiple_of(16) {
        out_of_bounds()
    }
}

#[inline(always)]
pub(crate) fn vector_ptr<T, const N: usize>(base: *const T, len: usize, i: usize) -> *const T {
    const { assert!(N * size_of::<T>() == 16, "a 16-byte access needs N * size_of::<T>() == 16") };
    let ptr = base.wrapping_add(i.wrapping_mul(N));
    if !vector_in_bounds::<N>(i, len) || !(ptr as usize).is_multiple_of(16) {
        out_of_bounds()
    }
    ptr
}

/// Elements `i` and `i + 1` of a kernel input of a 2-byte `T` in one 4-byte load, unchecked,
/// for a caller that checked a whole tile once.
///
/// # Safety
/// 1. `i + 2 <= input.len()`.
/// 2. Element `i` is 4-byte aligned.
#[inline(always)]
pub unsafe fn load_pair_unchecked<T: Copy>(input: &[T], i: usize) -> [T; 2] {
    const { assert!(size_of::<T>() == 2, "a pair load moves two 2-byte values") };
    core::mem::transmute_copy(&(input.as_ptr().add(i) as *const u32).read())
}

/// Elements `i .. i + 4` of a kernel input of a 2-byte `T` (four f16, say) in one 8-byte
/// load. Traps when out of bounds or not 8-byte aligned.
#[inline(always)]
pub fn load_quad<T: Copy>(input: &[T], i: usize) -> [T; 4] {
    const { assert!(size_of::<T>() == 2, "a quad load moves four 2-byte values") };
    let ptr = input.as_ptr().wrapping_add(i);
    if !in_bounds(i, 4, input.len()) || !(ptr as usize).is_multiple_of(8) {
        out_of_bounds()
    }
    // SAFETY: in bounds and 8-byte aligned (checked).
    unsafe { core::mem::transmute_copy(&(ptr as *const u64).read()) }
}

/// Elements `N * i .. N * i + N` of a kernel input in one 16-byte `ld.global.v4`; `[T; N]`
/// must be 16 bytes. Traps when out of bounds or misaligned. The coherent path: after
/// [`wait_for_prerequisites`](crate::grid::wait_for_prerequisites) it reads what the kernel
/// launched before this one wrote ([`load16_invariant`] reads weights faster, and may not).
#[inline(always)]
pub fn load16<T: Copy, const N: usize>(input: &[T], i: usize) -> [T; N] {
    vector_ptr::<T, N>(input.as_ptr(), input.len(), i);
    // SAFETY: in bounds and aligned (checked).
    unsafe { load16_unchecked(input, i) }
}

/// [`load16`] without its checks, for a caller that checked a whole run of vectors once.
///
/// # Safety
/// 1. `N (i + 1) <= input.len()`.
/// 2. `input` starts at a 16-byte-aligned address.
#[inline(always)]
pub unsafe fn load16_unchecked<T: Copy, const N: usize>(input: &[T], i: usize) -> [T; N] {
    from_words(arch::ld_global_v4_b32(input.as_ptr().add(N * i) as *const [u32; 4]))
}

/// [`load16`] through the read-only path (`ld.global.nc.v4`), for data no grid writes while
/// the kernel runs: weights, parameters. ptxas may issue it ahead of an earlier
/// [`wait_for_prerequisites`](crate::grid::wait_for_prerequisites), so that it overlaps the
/// wait. Traps when out of bounds or misaligned.
///
/// # Safety
/// 1. No grid writes `input` while this kernel runs: neither this one (inputs never are,
///    [`Out`]'s invariant 2) nor one it was launched programmatically after.
#[inline(always)]
pub unsafe fn load16_invariant<T: Copy, const N: usize>(input: &[T], i: usize) -> [T; N] {
    vector_ptr::<T, N>(input.as_ptr(), input.len(), i);
    // SAFETY: in bounds and aligned (checked); unwritten (the caller's promise).
    load16_invariant_unchecked(input, i)
}

/// [`load16_invariant`] without its checks.
///
/// # Safety
/// 1. As [`load16_invariant`]'s.
/// 2. `N (i + 1) <= input.len()`, and `input` starts at a 16-byte-aligned address.
#[inline(always)]
pub unsafe fn load16_invariant_unchecked<T: Copy, const N: usize>(input: &[T], i: usize) -> [T; N] {
    from_words(arch::ld_global_nc_v4_b32(input.as_ptr().add(N * i) as *const [u32; 4]))
}

/// An L2 eviction policy, for the loads that take one ([`load16_invariant_hinted_unchecked`],
/// `TensorMap::load_3d_hinted`). A hint: it changes what no load returns.
#[derive(Clone, Copy)]
pub struct L2Policy(u64);

impl L2Policy {
    /// Every line the loads bring into L2 is the first to go: for data read once per launch
    /// (a stream of weights larger than L2), so that it does not evict what is read again —
    /// activations, small tables, the kernels' own code.
    #[inline(always)]
    pub fn evict_first() -> Self {
        Self(arch::createpolicy_l2_evict_first())
    }

    /// The policy's opaque bits, for the `arch` loads.
    #[inline(always)]
    pub fn bits(self) -> u64 {
        self.0
    }
}

/// [`load16_invariant_unchecked`] under the L2 eviction `policy`.
///
/// # Safety
/// As [`load16_invariant_unchecked`].
#[inline(always)]
pub unsafe fn load16_invariant_hinted_unchecked<T: Copy, const N: usize>(input: &[T], i: usize, policy: L2Policy) -> [T; N] {
    from_words(arch::ld_global_nc_l2_hint_v4_b32(input.as_ptr().add(N * i) as *const [u32; 4], policy.bits()))
}

/// The `N` elements of `T` in 16 loaded bytes; `[T; N]` must be 16 bytes (a compile error
/// otherwise).
///
/// # Safety
/// 1. Every bit pattern is a valid `T` (the kernels' element types: floats, integers).
#[inline(always)]
unsafe fn from_words<T: Copy, const N: usize>(words: [u32; 4]) -> [T; N] {
    const { assert!(N * size_of::<T>() == 16, "a 16-byte access needs N * size_of::<T>() == 16") };
    core::mem::transmute_copy(&words)
}

/// Asks L2 to fetch `data` from memory ahead of its use, in one instruction
/// (`cp.async.bulk.prefetch.L2`): a hint that changes what no load returns, though the
/// calling thread waits until L2 takes it. Covers `data` from its first to its last 16-byte
/// boundary; a call on fewer bytes does nothing.
#[inline(always)]
pub fn prefetch_l2<T>(data: &[T]) {
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + size_of_val(data));
    let (first, last) = (start.next_multiple_of(16), end & !15);
    if last > first {
        let bytes = (last - first).min(u32::MAX as usize & !15) as u32;
        // SAFETY: `first .. first + bytes` lies in `data`, one live allocation, 16-byte aligned
        // and a multiple of 16 bytes long.
        unsafe { arch::cp_async_bulk_prefetch_l2_global(data.as_ptr().cast::<u8>().add(first - start), bytes) }
    }
}

#[cfg(test)]
mod tests {
    use super::{check16, load16, load_quad};

    #[repr(C, align(8))]
    struct Aligned([u16; 12]);

    fn data() -> Aligned {
        Aligned(core::array::from_fn(|i| i as u16))
    }

    #[test]
    fn load_quad_reads_four_consecutive_values() {
        assert_eq!(load_quad(&data().0, 4), [4, 5, 6, 7]);
        assert_eq!(load_quad(&data().0, 8), [8, 9, 10, 11]);
    }

    #[test]
    #[should_panic(expected = "out-of-bounds")]
    fn load_quad_traps_when_not_8_byte_aligned() {
        load_quad(&data().0, 2);
    }

    #[test]
    #[should_panic(expected = "out-of-bounds")]
    fn load_quad_traps_past_the_end() {
        load_quad(&data().0, 12);
    }

    // An index that wrapped below zero (`i - 1` at `i = 0`, say) must trap, not pass a check
    // whose own sum wraps back into range and read before the data.
    #[test]
    #[should_panic(expected = "out-of-bounds")]
    fn load_quad_traps_for_an_index_that_wrapped() {
        load_quad(&data().0, usize::MAX - 3);
    }

    #[repr(C, align(16))]
    struct Vectors([f32; 8]);

    #[test]
    #[should_panic(expected = "out-of-bounds")]
    fn load16_traps_for_an_index_that_wrapped() {
        load16::<f32, 4>(&Vectors([0.0; 8]).0, usize::MAX);
    }

    #[test]
    #[should_panic(expected = "out-of-bounds")]
    fn check16_traps_for_a_run_whose_length_wraps() {
        let v = Vectors([0.0; 8]);
        check16::<f32, 4>(v.0.as_ptr(), v.0.len(), usize::MAX / 4 + 1);
    }
}
