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
