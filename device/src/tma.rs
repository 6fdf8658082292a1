//! The tensor memory accelerator (TMA): tile loads from global to shared memory described by a
//! tensor map, completing on an mbarrier, and [`Pipeline`], the multi-stage shared-memory
//! pipeline a producer fills with them and consumers drain.
//!
//! The host builds a tensor map with `Gpu::tensor_map_2d` or `_3d` (`cuTensorMapEncodeTiled` on a GPU)
//! into 128 bytes of global memory and passes them as a `&[u64]` kernel argument;
//! [`TensorMap::new`] checks them. (rustc's nvptx back end cannot pass the 64-byte-aligned
//! `CUtensorMap` by value: it rejects parameters aligned to more than 16 bytes.)

use crate::arch;
use crate::global::L2Policy;
use crate::out_of_bounds;
use crate::shared::SharedSlice;

/// A tensor map in global memory.
#[derive(Clone, Copy)]
pub struct TensorMap {
    ptr: *const [u64; 16],
}

impl TensorMap {
    /// The tensor map in `words` (16 words, 64-byte aligned, as `Gpu::tensor_map_2d` makes
    /// it); traps otherwise.
    #[inline(always)]
    pub fn new(words: &[u64]) -> Self {
        let ptr = words.as_ptr();
        if words.len() < 16 || !(cfg!(not(target_arch = "nvptx64")) || (ptr as usize).is_multiple_of(64)) {
            out_of_bounds()
        }
        Self { ptr: ptr.cast() }
    }

    /// Starts loading the box at (column `c0`, row `c1`) into `dst`; it completes on the
    /// current phase of `full`'s barrier, which must expect its bytes.
    ///
    /// # Safety
    /// 1. `dst` has room for the box, is 1024-byte aligned (for the 128-byte swizzle; 512 for
    ///    the 64-byte one), and
    ///    nothing touches it until the barrier's phase completes.
    /// 2. `full` is an initialised mbarrier of this block whose current phase expects the
    ///    box's bytes.
    #[inline(always)]
    pub unsafe fn load_2d(self, dst: u32, c0: i32, c1: i32, full: u32) {
        arch::cp_async_bulk_tensor_2d_shared_global(dst, self.ptr, c0, c1, full)
    }

    /// Starts loading the box at (column `c0`, row `c1`, plane `c2`) of a 3-D map
    /// (`Gpu::tensor_map_3d`) into `dst`, plane after plane; as [`TensorMap::load_2d`].
    ///
    /// # Safety
    /// As [`TensorMap::load_2d`].
    #[inline(always)]
    pub unsafe fn load_3d(self, dst: u32, c0: i32, c1: i32, c2: i32, full: u32) {
        arch::cp_async_bulk_tensor_3d_shared_global(dst, self.ptr, c0, c1, c2, full)
    }

    /// [`TensorMap::load_3d`] under the L2 eviction `policy` (e.g. weights streamed once,
    /// [`L2Policy::evict_first`]).
    ///
    /// # Safety
    /// As [`TensorMap::load_2d`].
    #[inline(always)]
    pub unsafe fn load_3d_hinted(self, dst: u32, c0: i32, c1: i32, c2: i32, full: u32, policy: L2Policy) {
        arch::cp_async_bulk_tensor_3d_shared_global_l2_hint(dst, self.ptr, c0, c1, c2, full, policy.bits())
    }
}

/// Where a producer or consumer is in a [`Pipeline`]: the stage, and the parity of the phase
/// of its barriers it waits for next.
#[derive(Clone, Copy)]
pub struct PipelineState<const STAGES: usize> {
    stage: u32,
    phase: u32,
}

impl<const STAGES: usize> PipelineState<STAGES> {
    /// Stage 0, first phase.
    pub const START: Self = Self { stage: 0, phase: 0 };

    /// The stage.
    #[inline(always)]
    pub fn stage(self) -> usize {
        self.stage as usize
    }

    /// The next stage, wrapping (and flipping the phase) after the last.
    #[inline(always)]
    pub fn next(self) -> Self {
        if self.stage as usize + 1 == STAGES {
            Self { stage: 0, phase: self.phase ^ 1 }
        } else {
            Self { stage: self.stage + 1, phase: self.phase }
        }
    }
}

/// `STAGES` shared-memory buffers handed between one producer thread (issuing TMA loads) and
/// consumers: a *full* mbarrier per stage (one arrival, the producer's, plus the loads'
/// bytes) and an *empty* one (one arrival per consumer). Every load and arrival is this
/// block's, so its waits acquire at block scope
/// ([`arch::mbarrier_try_wait_parity_cta_shared_b64`]).
#[derive(Clone, Copy)]
pub struct Pipeline<const STAGES: usize> {
    full: u32,
    empty: u32,
}

impl<const STAGES: usize> Pipeline<STAGES> {
    /// The pipeline's barriers in `slots` (`2 * STAGES` words), initialised by thread 0 of the
    /// block for `consumers` consumer arrivals per stage. Every thread calls it.
    ///
    /// # Safety
    /// 1. Every thread of the block passes a block barrier after this call and before any
    ///    thread but the block's thread 0 (which initialised them) uses the pipeline (an
    ///    mbarrier used before its init is visible is undefined).
    /// 2. `slots[.. 2 * STAGES]` holds nothing else while the pipeline is in use.
    #[inline(always)]
    pub unsafe fn new(slots: SharedSlice<u64>, consumers: u32) -> Self {
        Self::of_warp(slots, consumers, 0, 1)
    }

    /// A pipeline per warp of the block (a warp that produces and consumes its own stages,
    /// e.g. lane 0 issuing [`SharedSlice::load_async`] and all 32 lanes consuming): warp `w`'s
    /// barriers are `slots[2·STAGES·w ..]` (a last, partial warp's too), all initialised by
    /// thread 0 of the block, each for `consumers` arrivals per stage. Returns the calling
    /// warp's; every thread calls it.
    ///
    /// # Safety
    /// As for [`Pipeline::new`], for every warp's barriers (`2 · STAGES` words a warp).
    #[inline(always)]
    pub unsafe fn per_warp(slots: SharedSlice<u64>, consumers: u32) -> Self {
        let warps = crate::block::size().div_ceil(32);
        Self::of_warp(slots, consumers, crate::warp::index_in_block(), warps)
    }

    /// Pipeline `own` of `count` whose barriers fill `slots`, all initialised by thread 0.
    #[inline(always)]
    fn of_warp(slots: SharedSlice<u64>, consumers: u32, own: u32, count: u32) -> Self {
        const { assert!(STAGES >= 2, "a pipeline needs at least two stages") };
        let words = 2 * STAGES as u32;
        if slots.len() < (words * count) as usize {
            out_of_bounds()
        }
        let at = |p: u32| slots.addr() + 8 * words * p;
        if crate::thread::rank_in_block() == 0 {
            for p in 0..count {
                for s in 0..words {
                    // SAFETY: 8 aligned bytes each of this block's shared memory, given to
                    // the barriers (the first `STAGES` full, the others empty); the caller's
                    // block barrier orders the inits before any use (`new`'s contract).
                    unsafe { arch::mbarrier_init_shared_b64(at(p) + 8 * s, if s < STAGES as u32 { 1 } else { consumers }) };
                }
            }
            arch::fence_mbarrier_init_release_cluster();
        }
        Self { full: at(own), empty: at(own) + 8 * STAGES as u32 }
    }

    /// Producer: waits until `state`'s stage is free (at once the first time round), then
    /// announces `bytes` of loads into it; returns the stage's full barrier for the loads.
    #[inline(always)]
    pub fn producer_acquire(&self, state: PipelineState<STAGES>, bytes: u32) -> u32 {
        let s = state.stage * 8;
        // SAFETY: initialised barriers of this block (`new`). Waiting for the parity before
        // the current phase's passes at once on a fresh barrier.
        unsafe {
            while !arch::mbarrier_try_wait_parity_cta_shared_b64(self.empty + s, state.phase ^ 1) {}
            arch::mbarrier_arrive_expect_tx_shared_b64(self.full + s, bytes);
        }
        self.full + s
    }

    /// The full barrier of `state`'s stage, for more loads into a stage the producer has
    /// already acquired (announcing their bytes then).
    #[inline(always)]
    pub fn full(&self, state: PipelineState<STAGES>) -> u32 {
        self.full + state.stage * 8
    }

    /// Consumer: waits until `state`'s stage is loaded.
    #[inline(always)]
    pub fn consumer_wait(&self, state: PipelineState<STAGES>) {
        // SAFETY: as above.
        while !unsafe { arch::mbarrier_try_wait_parity_cta_shared_b64(self.full + state.stage * 8, state.phase) } {}
    }

    /// Consumer: this consumer is done with `state`'s stage (one arrival on its empty barrier).
    #[inline(always)]
    pub fn consumer_release(&self, state: PipelineState<STAGES>) {
        // SAFETY: as above.
        unsafe { arch::mbarrier_arrive_shared_b64(self.empty + state.stage * 8) }
    }
}
