//! The launch, the angle table and the f64 reference.

use super::*;
use clusterfuse::host::{Buffer, Error, Gpu, Result, Stream};

/// What one launch rotates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub tokens: usize,
    /// Query heads per token.
    pub q_heads: usize,
    /// Key heads per token (grouped-query attention: fewer than `q_heads`).
    pub kv_heads: usize,
    /// Values per head, even.
    pub head_dim: usize,
    /// Positions the angle table holds.
    pub max_len: usize,
}

impl Shape {
    /// Values of `q`.
    pub fn q_len(&self) -> usize {
        self.tokens * self.q_heads * self.head_dim
    }

    /// Values of `k`.
    pub fn k_len(&self) -> usize {
        self.tokens * self.kv_heads * self.head_dim
    }
}

/// cos then sin of `p · θ^(−2i/head_dim)`, `i < head_dim / 2`, computed in f64 and
/// rounded once, as Hugging Face's Llama precomputes them: one position's row of [`table`].
pub fn angles(p: usize, head_dim: usize, theta: f64) -> Vec<f32> {
    let angles: Vec<f64> = (0..head_dim / 2).map(|i| p as f64 * theta.powf(-2.0 * i as f64 / head_dim as f64)).collect();
    angles.iter().map(|a| a.cos() as f32).chain(angles.iter().map(|a| a.sin() as f32)).collect()
}

/// [`angles`] of each position `p < max_len`: the table [`rotate`] takes.
pub fn table(max_len: usize, head_dim: usize, theta: f64) -> Vec<f32> {
    (0..max_len).flat_map(|p| angles(p, head_dim, theta)).collect()
}

/// An element type of the kernels: `f16` or `bf16`.
pub trait RopeType: HalfFloat + clusterfuse::host::cudarc::driver::DeviceRepr {
    /// Launches this type's kernel.
    #[allow(clippy::too_many_arguments)]
    fn launch(kernels: &Kernels, stream: &Stream, config: &LaunchConfig, q: &mut Buffer<Self>, k: &mut Buffer<Self>, positions: &Buffer<u32>, table: &Buffer<f32>, shape: Shape) -> Result<()>;
}

/// Both kernels, loaded on one device.
pub struct Kernels {
    f16: rope_f16::Kernel,
    bf16: rope_bf16::Kernel,
}

impl Kernels {
    /// Loads them.
    pub fn load(gpu: &Gpu) -> Result<Self> {
        Ok(Self { f16: rope_f16::load(gpu)?, bf16: rope_bf16::load(gpu)? })
    }
}

macro_rules! rope_type {
    ($($t:ident: $field:ident;)*) => {$(
        impl RopeType for $t {
            fn launch(kernels: &Kernels, stream: &Stream, config: &LaunchConfig, q: &mut Buffer<Self>, k: &mut Buffer<Self>, positions: &Buffer<u32>, table: &Buffer<f32>, s: Shape) -> Result<()> {
                kernels.$field.launch(stream, config, q, k, positions, table, s.q_heads as u32, s.kv_heads as u32, s.head_dim as u32)
            }
        }
    )*};
}

rope_type! {
    f16: f16;
    bf16: bf16;
}

/// Rotates `q` and `k` in place on `stream` ([module docs](super)): token `t` at position
/// `positions[t]`, angles from `table` ([`table`] of `shape.max_len` positions). Refuses,
/// with [`Error::UnsupportedShape`], an odd or zero head size, no heads, buffers shorter
/// than the shape, and a table of other than `max_len` positions. A position at or past
/// `max_len` traps the kernel (an error at the next synchronisation).
#[allow(clippy::too_many_arguments)]
pub fn rotate<T: RopeType>(kernels: &Kernels, stream: &Stream, shape: Shape, q: &mut Buffer<T>, k: &mut Buffer<T>, positions: &Buffer<u32>, table: &Buffer<f32>) -> Result<()> {
    let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel: "rope", reason });
    let Shape { tokens, q_heads, kv_heads, head_dim, max_len } = shape;
    if head_dim == 0 || !head_dim.is_multiple_of(2) || q_heads + kv_heads == 0 {
        return unsupported(format!("{q_heads} + {kv_heads} heads of {head_dim}: heads needed, of an even size"));
    }
    let short = [("q", q.len(), shape.q_len()), ("k", k.len(), shape.k_len()), ("positions", positions.len(), tokens)];
    if let Some((what, len, need)) = short.into_iter().find(|&(_, len, need)| len < need) {
        return unsupported(format!("{what} holds {len} values; {shape:?} needs {need}"));
    }
    if table.len() != max_len * head_dim {
        return unsupported(format!("the table holds {} values; {max_len} positions of {head_dim} are {}", table.len(), max_len * head_dim));
    }
    let pairs = tokens * (q_heads + kv_heads) * head_dim / 2;
    if pairs > u32::MAX as usize {
        return unsupported(format!("{pairs} pairs: at most 2^32 a launch"));
    }
    let config = LaunchConfig { grid: (pairs.div_ceil(BLOCK as usize).max(1) as u32).into(), block: BLOCK.into(), ..LaunchConfig::default() };
    T::launch(kernels, stream, &config, q, k, positions, table, shape)
}

/// `x` (`tokens × heads × head_dim`) rotated, in f64, token `t` at `positions[t]`, the
/// angles computed in f64 from `theta`.
pub fn reference<T: HalfFloat>(x: &[T], positions: &[u32], heads: usize, head_dim: usize, theta: f64) -> Vec<f64> {
    let half = head_dim / 2;
    let mut out: Vec<f64> = x.iter().map(|v| v.to_f32() as f64).collect();
    for (row, values) in out.chunks_mut(head_dim).enumerate() {
        let p = positions[row / heads] as f64;
        for i in 0..half {
            let (sin, cos) = (p * theta.powf(-2.0 * i as f64 / head_dim as f64)).sin_cos();
            let (lo, hi) = (values[i], values[i + half]);
            values[i] = lo * cos - hi * sin;
            values[i + half] = hi * cos + lo * sin;
        }
    }
    out
}
