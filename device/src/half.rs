//! 16-bit floats. On the GPU, `f16` is Rust's own `f16` (arithmetic compiles to `add.rn.f16`,
//! `mul.rn.f16`, ...) and `bf16` a thin type over `add/mul/fma.rn.bf16`; on the host both are
//! the `half` crate's types, which have the same layout, so buffers move between the two as is.
//! [`HalfFloat`] gives both sides the same conversions.

#[cfg(not(target_arch = "nvptx64"))]
pub use half::{bf16, f16};

#[cfg(target_arch = "nvptx64")]
mod primitive {
    /// Rust's own `f16`, re-exported under its name.
    pub type F16 = f16;
}

#[cfg(target_arch = "nvptx64")]
pub use primitive::F16 as f16;

/// Conversions shared by `f16` and `bf16` on both the GPU and the host.
pub trait HalfFloat: Copy {
    /// Rounds an `f32` to the nearest value of this type.
    fn from_f32(x: f32) -> Self;
    /// Widens to `f32` exactly.
    fn to_f32(self) -> f32;
}

#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::{bf16, f16, HalfFloat};

    impl HalfFloat for f16 {
        fn from_f32(x: f32) -> Self {
            f16::from_f32(x)
        }
        fn to_f32(self) -> f32 {
            f16::to_f32(self)
        }
    }

    impl HalfFloat for bf16 {
        fn from_f32(x: f32) -> Self {
            bf16::from_f32(x)
        }
        fn to_f32(self) -> f32 {
            bf16::to_f32(self)
        }
    }
}

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::{f16, HalfFloat};
    use crate::arch;
    use core::ops::{Add, AddAssign, Mul, MulAssign, Neg, Sub};

    impl HalfFloat for f16 {
        #[inline(always)]
        fn from_f32(x: f32) -> Self {
            x as f16
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            self as f32
        }
    }

    /// bfloat16: 8 exponent bits, 7 mantissa bits.
    #[allow(non_camel_case_types)]
    #[derive(Clone, Copy, Default, PartialEq)]
    #[repr(transparent)]
    pub struct bf16(u16);

    impl bf16 {
        /// The value with these raw bits.
        #[inline(always)]
        pub const fn from_bits(bits: u16) -> Self {
            Self(bits)
        }
        /// The raw bits.
        #[inline(always)]
        pub const fn to_bits(self) -> u16 {
            self.0
        }
    }

    impl HalfFloat for bf16 {
        #[inline(always)]
        fn from_f32(x: f32) -> Self {
            Self(arch::cvt_rn_bf16_f32(x))
        }
        #[inline(always)]
        fn to_f32(self) -> f32 {
            arch::cvt_f32_bf16(self.0)
        }
    }

    impl Add for bf16 {
        type Output = Self;
        #[inline(always)]
        fn add(self, rhs: Self) -> Self {
            Self(arch::add_rn_bf16(self.0, rhs.0))
        }
    }

    impl Sub for bf16 {
        type Output = Self;
        #[inline(always)]
        fn sub(self, rhs: Self) -> Self {
            self + -rhs
        }
    }

    impl Mul for bf16 {
        type Output = Self;
        #[inline(always)]
        fn mul(self, rhs: Self) -> Self {
            Self(arch::mul_rn_bf16(self.0, rhs.0))
        }
    }

    impl Neg for bf16 {
        type Output = Self;
        #[inline(always)]
        fn neg(self) -> Self {
            Self(self.0 ^ 0x8000)
        }
    }

    impl AddAssign for bf16 {
        #[inline(always)]
        fn add_assign(&mut self, rhs: Self) {
            *self = *self + rhs;
        }
    }

    impl MulAssign for bf16 {
        #[inline(always)]
        fn mul_assign(&mut self, rhs: Self) {
            *self = *self * rhs;
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::bf16;
