//! Warp scope: lanes, shuffles, votes and warp-wide reductions (all 32 lanes take part).

use crate::arch;
use crate::ops::{Element, Max, ReduceOp, Sum};

/// Every lane of the warp.
pub const FULL_MASK: u32 = u32::MAX;

/// The calling thread's lane (0-31).
#[inline(always)]
pub fn lane() -> u32 {
    arch::laneid()
}

/// The calling thread's warp in its block.
#[inline(always)]
pub fn index_in_block() -> u32 {
    crate::thread::rank_in_block() / crate::limits::WARP_SIZE
}

/// `__syncwarp()`.
#[inline(always)]
pub fn sync() {
    arch::bar_warp_sync(FULL_MASK)
}

/// The value of lane `lane() ^ lane_mask`.
#[inline(always)]
pub fn shuffle_xor<T: Element>(value: T, lane_mask: u32) -> T {
    T::from_word(arch::shfl_sync_bfly_b32(value.to_word(), lane_mask, FULL_MASK))
}

/// The value of lane `lane() + delta` (the caller's own value past lane 31).
#[inline(always)]
pub fn shuffle_down<T: Element>(value: T, delta: u32) -> T {
    T::from_word(arch::shfl_sync_down_b32(value.to_word(), delta, FULL_MASK))
}

/// The value of lane `lane() - delta` (the caller's own value before lane 0).
#[inline(always)]
pub fn shuffle_up<T: Element>(value: T, delta: u32) -> T {
    T::from_word(arch::shfl_sync_up_b32(value.to_word(), delta, FULL_MASK))
}

/// The value of lane `src_lane`.
#[inline(always)]
pub fn broadcast<T: Element>(value: T, src_lane: u32) -> T {
    T::from_word(arch::shfl_sync_idx_b32(value.to_word(), src_lane, FULL_MASK))
}

/// Bit `i` is lane `i`'s `predicate`.
#[inline(always)]
pub fn ballot(predicate: bool) -> u32 {
    arch::vote_sync_ballot_b32(predicate, FULL_MASK)
}

/// True when `predicate` holds on every lane.
#[inline(always)]
pub fn all(predicate: bool) -> bool {
    ballot(predicate) == FULL_MASK
}

/// True when `predicate` holds on some lane.
#[inline(always)]
pub fn any(predicate: bool) -> bool {
    ballot(predicate) != 0
}

/// All-reduce over the warp with `op`: every lane gets the result. A butterfly, so the
/// order of combination is fixed and every lane's result is bitwise the same.
#[inline(always)]
pub fn reduce<T: Element, Op: ReduceOp<T>>(value: T, _op: Op) -> T {
    let mut v = value;
    let mut mask = 16;
    while mask > 0 {
        v = Op::combine(v, shuffle_xor(v, mask));
        mask >>= 1;
    }
    v
}

/// Sum over the warp; every lane gets it.
#[inline(always)]
pub fn reduce_sum<T: Element>(value: T) -> T {
    reduce(value, Sum)
}

/// Maximum over the warp; every lane gets it.
#[inline(always)]
pub fn reduce_max<T: Element>(value: T) -> T {
    reduce(value, Max)
}
