//! Halves packed two to a 32-bit word, as 16-byte loads bring them in: a vector of eight
//! halves then holds four registers until it is used ([`widen8`]), not eight, which is what
//! lets a thread keep many weight loads in flight.

use crate::math::Fma;
use crate::{bf16, f16, HalfFloat};

/// 16-bit floats whose pairs widen from a packed word with integer operations (a
/// reinterpreting copy would let LLVM split the words into halves again, a register each).
pub trait Packed: HalfFloat {
    /// The low and the high half of `word`, as f32.
    fn widen(word: u32) -> [f32; 2];
}

impl Packed for f16 {
    #[inline(always)]
    fn widen(word: u32) -> [f32; 2] {
        [f16::from_bits(word as u16).to_f32(), f16::from_bits((word >> 16) as u16).to_f32()]
    }
}

impl Packed for bf16 {
    #[inline(always)]
    fn widen(word: u32) -> [f32; 2] {
        [f32::from_bits(word << 16), f32::from_bits(word & 0xffff_0000)]
    }
}

/// The 8 halves of a vector of four words (the first half in the low bits of the first
/// word), widened to f32.
#[inline(always)]
pub fn widen8<T: Packed>(words: [u32; 4]) -> [f32; 8] {
    let mut wide = [0.0f32; 8];
    for k in 0..4 {
        [wide[2 * k], wide[2 * k + 1]] = T::widen(words[k]);
    }
    wide
}

/// `acc + Σ w[k]·x[k]` in f32, in order of `k`, with `w` a vector of four words of `T`.
#[inline(always)]
pub fn dot8<T: Packed>(w: [u32; 4], x: [f32; 8], acc: f32) -> f32 {
    let (w, mut acc) = (widen8::<T>(w), acc);
    for k in 0..8 {
        acc = w[k].fma(x[k], acc);
    }
    acc
}

/// `input` as words, two halves each (an odd length's last half left out).
///
/// # Safety
/// 1. `input` starts 4-byte aligned: a kernel argument does (device allocations are 256-byte
///    aligned), a sub-slice does from an even index.
#[inline(always)]
pub unsafe fn words<T: HalfFloat>(input: &[T]) -> &[u32] {
    const { assert!(core::mem::size_of::<T>() == 2, "16-bit elements") };
    // SAFETY: `T` is two bytes of plain data, and the caller guarantees the alignment, so the
    // slice's bytes read as `len / 2` words.
    unsafe { core::slice::from_raw_parts(input.as_ptr().cast::<u32>(), input.len() / 2) }
}
