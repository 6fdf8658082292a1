//! Fused multiply-add and fast math. rustc never contracts `a * b + c` into an FMA on this
//! target, so [`Fma::fma`] is how a kernel asks for one.

use crate::arch;
use crate::{bf16, f16};

/// A fused multiply-add with a single rounding.
pub trait Fma: Copy {
    /// `self * b + c`, rounded once.
    fn fma(self, b: Self, c: Self) -> Self;
}

impl Fma for f32 {
    #[inline(always)]
    fn fma(self, b: f32, c: f32) -> f32 {
        arch::fma_rn_f32(self, b, c)
    }
}

impl Fma for f16 {
    #[inline(always)]
    fn fma(self, b: f16, c: f16) -> f16 {
        f16::from_bits(arch::fma_rn_f16(self.to_bits(), b.to_bits(), c.to_bits()))
    }
}

impl Fma for bf16 {
    #[inline(always)]
    fn fma(self, b: bf16, c: bf16) -> bf16 {
        bf16::from_bits(arch::fma_rn_bf16(self.to_bits(), b.to_bits(), c.to_bits()))
    }
}

/// The larger of `a` and `b`, NaN when either is NaN (`max.NaN.f32`; `f32::max` ignores a NaN).
#[inline(always)]
pub fn maximum(a: f32, b: f32) -> f32 {
    arch::max_nan_f32(a, b)
}

/// `2^x` (`ex2.approx.ftz`): about 2 ulp, subnormals flushed.
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    arch::ex2_approx_ftz_f32(x)
}

/// `e^x` through `exp2(x * log2(e))`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp2(x * core::f32::consts::LOG2_E)
}

/// `1 / sqrt(x)` (`rsqrt.approx.ftz`): about 2 ulp.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    arch::rsqrt_approx_ftz_f32(x)
}

/// `1 / x` (`rcp.approx.ftz`): about 1 ulp.
#[inline(always)]
pub fn rcp(x: f32) -> f32 {
    arch::rcp_approx_ftz_f32(x)
}

/// `tanh(x)` (`tanh.approx`): relative error about 2^-11.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    arch::tanh_approx_f32(x)
}

/// Correctly rounded square root.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    arch::sqrt_rn_f32(x)
}
