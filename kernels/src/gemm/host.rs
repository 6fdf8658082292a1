//! The `mma.sync` GEMMs on the host: launch shapes and their errors, random operands and
//! their f64 dot products.

use super::*;
use clusterfuse::host::cudarc::driver::DeviceRepr;
use clusterfuse::host::{Buffer, Error, Result};
use clusterfuse::Dim3;
use rand::Rng;
use std::fmt;

/// Which epilogue: each is its own kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpilogueKind {
    None,
    Bias,
    BiasGelu,
    Residual,
    Scale,
}

impl EpilogueKind {
    /// Every kind, in the order the examples run them.
    pub const ALL: [EpilogueKind; 5] = [Self::None, Self::Bias, Self::BiasGelu, Self::Residual, Self::Scale];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Bias => "bias",
            Self::BiasGelu => "bias+gelu",
            Self::Residual => "residual",
            Self::Scale => "scale",
        }
    }

    /// The f64 reference of the output at (`row`, `col`) from the exact product `dot`.
    pub fn reference<T: HalfFloat>(self, dot: f64, row: usize, col: usize, n: usize, operands: &HostOperands<T>) -> f64 {
        let value = |v: T| v.to_f32() as f64;
        match self {
            Self::None => dot,
            Self::Bias => dot + value(operands.bias[col]),
            Self::BiasGelu => {
                let x = dot + value(operands.bias[col]);
                0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
            }
            Self::Residual => dot + value(operands.residual[row * n + col]),
            Self::Scale => operands.alpha as f64 * dot,
        }
    }
}

/// Why a GEMM was not launched, or failed.
#[derive(Debug)]
pub enum GemmError {
    /// The shape is not supported, or a buffer does not hold it: what and why.
    Shape(String),
    /// The launch itself failed.
    Launch(Error),
}

impl fmt::Display for GemmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Shape(what) => write!(f, "unsupported GEMM: {what}"),
            Self::Launch(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for GemmError {}

impl From<Error> for GemmError {
    fn from(err: Error) -> Self {
        Self::Launch(err)
    }
}

/// The launch configuration of an M × N × K GEMM, or why the kernels cannot compute it.
pub fn config(m: usize, n: usize, k: usize) -> std::result::Result<LaunchConfig, GemmError> {
    let reject = |what: String| Err(GemmError::Shape(format!("M = {m}, N = {n}, K = {k}: {what}")));
    if m == 0 || n == 0 || k == 0 {
        return reject("every dimension must be at least 1".into());
    }
    if !n.is_multiple_of(8) || !k.is_multiple_of(8) {
        return reject("N and K must be multiples of 8 (rows of A, B and C are copied 16 bytes at a time); pad them".into());
    }
    if m.div_ceil(BM) > 65535 || m * k > u32::MAX as usize || k * n > u32::MAX as usize || m * n > u32::MAX as usize {
        return reject("too large: at most 65535 row tiles of 128 and 2^32 elements per matrix".into());
    }
    let splits = split_k(n.div_ceil(BN) * m.div_ceil(BM), k.div_ceil(BK));
    Ok(LaunchConfig {
        grid: (n.div_ceil(BN) as u32, m.div_ceil(BM) as u32, splits).into(),
        block: (THREADS as u32).into(),
        cluster: (splits > 1).then(|| Dim3::new(1, 1, splits)),
        dynamic_smem_bytes: SMEM_BYTES,
        ..LaunchConfig::default()
    })
}

/// Blocks per output tile (a cluster along z, splitting K): doubled from 1 while the grid
/// stays within one wave of two blocks per SM of an H200 (132 SMs) and every block keeps
/// two k-steps, up to the portable cluster of 8. Small-M GEMMs (a BERT layer at batch 1:
/// M = 128, 6-24 tiles) would otherwise leave most SMs idle. (One k-step a block was
/// slower on the H200: the reduction over DSMEM then outweighs the split work.)
pub fn split_k(tiles: usize, steps: usize) -> u32 {
    let mut splits = 1;
    while splits < 8 && tiles * splits * 2 <= 2 * 132 && steps >= 2 * (splits * 2) {
        splits *= 2;
    }
    splits as u32
}

/// The GEMM's inputs on the host.
pub struct HostOperands<T> {
    pub a: Vec<T>,
    pub b: Vec<T>,
    pub bias: Vec<T>,
    pub residual: Vec<T>,
    pub alpha: f32,
}

impl<T: HalfFloat> HostOperands<T> {
    /// Fresh random operands of an M × N × K GEMM, uniform in [-1, 1).
    pub fn random(rng: &mut impl Rng, m: usize, n: usize, k: usize) -> Self {
        let mut values = |len: usize| (0..len).map(|_| T::from_f32(rng.random_range(-1.0..1.0))).collect::<Vec<T>>();
        let (a, b, bias, residual) = (values(m * k), values(k * n), values(n), values(m * n));
        Self { a, b, bias, residual, alpha: rng.random_range(0.5..2.0) }
    }

    /// `Σ_k a[row, k] · b[k, col]`, exactly (in f64).
    pub fn dot(&self, row: usize, col: usize, n: usize, k: usize) -> f64 {
        (0..k).map(|i| self.a[row * k + i].to_f32() as f64 * self.b[i * n + col].to_f32() as f64).sum()
    }
}

/// The GEMM's inputs on a device.
pub struct Operands<T> {
    pub a: Buffer<T>,
    pub b: Buffer<T>,
    pub bias: Buffer<T>,
    pub residual: Buffer<T>,
    pub alpha: f32,
}

impl<T: DeviceRepr + Copy> Operands<T> {
    /// Copies `host` to `gpu`.
    pub fn upload(gpu: &Gpu, host: &HostOperands<T>) -> Result<Self> {
        Ok(Self {
            a: gpu.upload(&host.a)?,
            b: gpu.upload(&host.b)?,
            bias: gpu.upload(&host.bias)?,
            residual: gpu.upload(&host.residual)?,
            alpha: host.alpha,
        })
    }
}

/// An element type of the GEMM kernels, with its five kernels loaded.
pub trait GemmType: HalfFloat + DeviceRepr + Copy {
    /// The type's name in reports.
    const NAME: &'static str;
    /// The kernels of this type, loaded on one device.
    type Kernels;
    /// Loads the five kernels.
    fn load(gpu: &Gpu) -> Result<Self::Kernels>;
    /// `out = epilogue(a · b)` for an M × N × K GEMM, after checking the shape and buffers.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        kernels: &Self::Kernels,
        gpu: &Gpu,
        epilogue: EpilogueKind,
        x: &Operands<Self>,
        out: &mut Buffer<Self>,
        m: usize,
        n: usize,
        k: usize,
    ) -> std::result::Result<(), GemmError>;
}

/// Checks that the buffers hold an M × N × K GEMM's operands.
fn check_buffers<T>(x: &Operands<T>, out: &Buffer<T>, epilogue: EpilogueKind, (m, n, k): (usize, usize, usize)) -> std::result::Result<(), GemmError> {
    let mut needs = vec![("A", x.a.len(), m * k), ("B", x.b.len(), k * n), ("C", out.len(), m * n)];
    match epilogue {
        EpilogueKind::Bias | EpilogueKind::BiasGelu => needs.push(("bias", x.bias.len(), n)),
        EpilogueKind::Residual => needs.push(("residual", x.residual.len(), m * n)),
        EpilogueKind::None | EpilogueKind::Scale => {}
    }
    match needs.into_iter().find(|&(_, len, need)| len < need) {
        Some((what, len, need)) => Err(GemmError::Shape(format!("{what} holds {len} elements; M = {m}, N = {n}, K = {k} needs {need}"))),
        None => Ok(()),
    }
}

macro_rules! gemm_type {
    ($($t:ident, $kernels:ident, $name:literal: $plain:ident, $bias:ident, $bias_gelu:ident, $residual:ident, $scale:ident;)*) => {$(
        #[doc = concat!("The ", $name, " GEMM kernels, loaded.")]
        pub struct $kernels {
            plain: $plain::Kernel,
            bias: $bias::Kernel,
            bias_gelu: $bias_gelu::Kernel,
            residual: $residual::Kernel,
            scale: $scale::Kernel,
        }

        impl GemmType for $t {
            const NAME: &'static str = $name;
            type Kernels = $kernels;

            fn load(gpu: &Gpu) -> Result<$kernels> {
                Ok($kernels {
                    plain: $plain::load(gpu)?,
                    bias: $bias::load(gpu)?,
                    bias_gelu: $bias_gelu::load(gpu)?,
                    residual: $residual::load(gpu)?,
                    scale: $scale::load(gpu)?,
                })
            }

            fn launch(kernels: &$kernels, gpu: &Gpu, epilogue: EpilogueKind, x: &Operands<$t>, out: &mut Buffer<$t>, m: usize, n: usize, k: usize) -> std::result::Result<(), GemmError> {
                let config = config(m, n, k)?;
                check_buffers(x, out, epilogue, (m, n, k))?;
                let (s, (m, n, k)) = (gpu.stream(), (m as u32, n as u32, k as u32));
                match epilogue {
                    EpilogueKind::None => kernels.plain.launch(s, &config, &x.a, &x.b, out, m, n, k)?,
                    EpilogueKind::Bias => kernels.bias.launch(s, &config, &x.a, &x.b, &x.bias, out, m, n, k)?,
                    EpilogueKind::BiasGelu => kernels.bias_gelu.launch(s, &config, &x.a, &x.b, &x.bias, out, m, n, k)?,
                    EpilogueKind::Residual => kernels.residual.launch(s, &config, &x.a, &x.b, &x.residual, out, m, n, k)?,
                    EpilogueKind::Scale => kernels.scale.launch(s, &config, &x.a, &x.b, out, x.alpha, m, n, k)?,
                }
                Ok(())
            }
        }
    )*};
}

gemm_type! {
    f16, F16Kernels, "f16": gemm_f16, gemm_f16_bias, gemm_f16_bias_gelu, gemm_f16_residual, gemm_f16_scale;
    bf16, Bf16Kernels, "bf16": gemm_bf16, gemm_bf16_bias, gemm_bf16_bias_gelu, gemm_bf16_residual, gemm_bf16_scale;
}

/// Relative error allowed: the output's rounding (2^-11 for f16, 2^-8 for bf16) with
/// room for `tanh.approx` in GELU and the f32 accumulation over K.
pub const F16_TOLERANCE: f64 = 1e-3;
/// See [`F16_TOLERANCE`].
pub const BF16_TOLERANCE: f64 = 5e-3;
