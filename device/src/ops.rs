//! Element types and reduction operators shared by the warp, block and cluster collectives.

use crate::{bf16, f16};
#[cfg(target_arch = "nvptx64")]
use crate::HalfFloat;

/// A type the collectives can add, compare and move through a 32-bit shuffle.
pub trait Element: Copy {
    /// Additive identity.
    const ZERO: Self;
    /// The smallest value (identity of `max`).
    const LOWEST: Self;
    /// The largest value (identity of `min`).
    const HIGHEST: Self;
    /// `a + b`.
    fn add(a: Self, b: Self) -> Self;
    /// The larger of `a` and `b`.
    fn max(a: Self, b: Self) -> Self;
    /// The smaller of `a` and `b`.
    fn min(a: Self, b: Self) -> Self;
    /// The value as a 32-bit word (zero-extended), for shuffles.
    fn to_word(self) -> u32;
    /// Inverse of [`Element::to_word`].
    fn from_word(word: u32) -> Self;
}

macro_rules! float_element {
    ($ty:ty) => {
        impl Element for $ty {
            const ZERO: Self = 0.0;
            const LOWEST: Self = <$ty>::NEG_INFINITY;
            const HIGHEST: Self = <$ty>::INFINITY;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { if a >= b { a } else { b } }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { if a <= b { a } else { b } }
            #[inline(always)]
            fn to_word(self) -> u32 { self.to_bits() as u32 }
            #[inline(always)]
            fn from_word(word: u32) -> Self { <$ty>::from_bits(word as _) }
        }
    };
}

float_element!(f32);

macro_rules! int_element {
    ($ty:ty) => {
        impl Element for $ty {
            const ZERO: Self = 0;
            const LOWEST: Self = <$ty>::MIN;
            const HIGHEST: Self = <$ty>::MAX;
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { if a >= b { a } else { b } }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { if a <= b { a } else { b } }
            #[inline(always)]
            fn to_word(self) -> u32 { self as u32 }
            #[inline(always)]
            fn from_word(word: u32) -> Self { word as $ty }
        }
    };
}

int_element!(i32);
int_element!(u32);

macro_rules! half_element {
    ($ty:ty, $neg_inf:literal, $inf:literal) => {
        impl Element for $ty {
            const ZERO: Self = <$ty>::from_bits(0);
            const LOWEST: Self = <$ty>::from_bits($neg_inf);
            const HIGHEST: Self = <$ty>::from_bits($inf);
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self { a + b }
            #[inline(always)]
            fn max(a: Self, b: Self) -> Self { if a.to_f32() >= b.to_f32() { a } else { b } }
            #[inline(always)]
            fn min(a: Self, b: Self) -> Self { if a.to_f32() <= b.to_f32() { a } else { b } }
            #[inline(always)]
            fn to_word(self) -> u32 { self.to_bits() as u32 }
            #[inline(always)]
            fn from_word(word: u32) -> Self { <$ty>::from_bits(word as u16) }
        }
    };
}

half_element!(f16, 0xfc00, 0x7c00);
half_element!(bf16, 0xff80, 0x7f80);

/// A reduction operator: an identity and an associative combination.
pub trait ReduceOp<T: Element>: Copy {
    /// The value that leaves any other unchanged.
    fn identity() -> T;
    /// Combines two partial results.
    fn combine(a: T, b: T) -> T;
}

/// Addition.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sum;
/// Maximum.
#[derive(Clone, Copy, Debug, Default)]
pub struct Max;
/// Minimum.
#[derive(Clone, Copy, Debug, Default)]
pub struct Min;

impl<T: Element> ReduceOp<T> for Sum {
    #[inline(always)]
    fn identity() -> T { T::ZERO }
    #[inline(always)]
    fn combine(a: T, b: T) -> T { T::add(a, b) }
}

impl<T: Element> ReduceOp<T> for Max {
    #[inline(always)]
    fn identity() -> T { T::LOWEST }
    #[inline(always)]
    fn combine(a: T, b: T) -> T { T::max(a, b) }
}

impl<T: Element> ReduceOp<T> for Min {
    #[inline(always)]
    fn identity() -> T { T::HIGHEST }
    #[inline(always)]
    fn combine(a: T, b: T) -> T { T::min(a, b) }
}

/// `(value, index)` as one `u64` ordered by value, larger first, then by index, lower first:
/// a total order, so that an argmax or a top-k over keys ([`warp::reduce_max_u64`]) is exact
/// and breaks ties by the lower index. The key of every non-NaN value is above 0, which can
/// stand for "none". NaNs are not supported.
///
/// [`warp::reduce_max_u64`]: crate::warp::reduce_max_u64
#[inline(always)]
pub fn rank_key(value: f32, index: u32) -> u64 {
    let bits = value.to_bits();
    let ordered = if bits >> 31 == 1 { !bits } else { bits | 0x8000_0000 };
    ((ordered as u64) << 32) | (u32::MAX - index) as u64
}

/// The `(value, index)` of a [`rank_key`].
#[inline(always)]
pub fn rank_unkey(key: u64) -> (f32, u32) {
    let ordered = (key >> 32) as u32;
    let bits = if ordered >> 31 == 1 { ordered & 0x7fff_ffff } else { !ordered };
    (f32::from_bits(bits), u32::MAX - key as u32)
}

#[cfg(test)]
mod tests {
    use super::{rank_key, rank_unkey};

    #[test]
    fn rank_keys_order_larger_values_then_lower_indices_and_invert() {
        let values = [f32::NEG_INFINITY, -3.5, -0.0, 0.0, 1e-30, 2.0, f32::INFINITY];
        for (i, &a) in values.iter().enumerate() {
            assert!(rank_key(a, 7) > 0);
            assert_eq!(rank_unkey(rank_key(a, 7)).0.to_bits(), a.to_bits());
            assert_eq!(rank_unkey(rank_key(a, 7)).1, 7);
            for &b in &values[i + 1..] {
                assert!(rank_key(b, 9) > rank_key(a, 3), "{b} before {a}");
            }
            assert!(rank_key(a, 3) > rank_key(a, 4), "ties go to the lower index");
        }
    }
}
