//! Warp scope: lanes, shuffles, votes and reductions over the warp or groups of its lanes (all
//! 32 lanes take part).

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

/// All-reduce with `op` over each group of `LANES` consecutive lanes (a power of two up to
/// 32; every lane of the warp calls it): every lane gets its group's result. A butterfly,
/// lane masks `LANES / 2` down to 1, so the order of combination is fixed and every lane of
/// a group gets a bitwise-equal result.
#[inline(always)]
pub fn group_reduce<const LANES: u32, T: Element, Op: ReduceOp<T>>(value: T, _op: Op) -> T {
    const { assert!(LANES.is_power_of_two() && LANES <= 32, "a group is 1, 2, 4, 8, 16 or 32 lanes") };
    let mut v = value;
    let mut mask = LANES / 2;
    while mask > 0 {
        v = Op::combine(v, shuffle_xor(v, mask));
        mask >>= 1;
    }
    v
}

/// Sum over each group of `LANES` consecutive lanes ([`group_reduce`]).
#[inline(always)]
pub fn group_sum<const LANES: u32, T: Element>(value: T) -> T {
    group_reduce::<LANES, T, Sum>(value, Sum)
}

/// All-reduce over the warp with `op`: every lane gets the result ([`group_reduce`] over one
/// group of 32).
#[inline(always)]
pub fn reduce<T: Element, Op: ReduceOp<T>>(value: T, op: Op) -> T {
    group_reduce::<32, T, Op>(value, op)
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

/// The largest `u64` of the warp (two 32-bit shuffles a step), in every lane: e.g. the
/// [`rank_key`](crate::ops::rank_key) of an argmax.
#[inline(always)]
pub fn reduce_max_u64(mut value: u64) -> u64 {
    for mask in [16, 8, 4, 2, 1] {
        let low = arch::shfl_sync_bfly_b32(value as u32, mask, FULL_MASK);
        let high = arch::shfl_sync_bfly_b32((value >> 32) as u32, mask, FULL_MASK);
        value = value.max(((high as u64) << 32) | low as u64);
    }
    value
}
