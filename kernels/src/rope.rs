//! Rotary position embedding (RoPE) of queries and keys, in place, f16 or bf16, in the
//! rotate-half form Hugging Face's Llama uses: for each head of a token at position `p`, the
//! pair `(x[i], x[i + d/2])` turns by the angle `p · θ^(−2i/d)`,
//!
//! `x'[i] = x[i]·cos − x[i + d/2]·sin`, `x'[i + d/2] = x[i + d/2]·cos + x[i]·sin`.
//!
//! One launch rotates both tensors: `q` (`tokens × q_heads × d`) and `k` (`tokens × kv_heads ×
//! d`), row-major, each token at its own position (a batch of decode steps, or a prefill).
//! The angles come from a table ([`host::table`]: per position, cos then sin of the `d/2`
//! angles, computed in f64 and rounded to f32 once, as Hugging Face precomputes them), so that
//! large positions lose nothing to f32 angle arithmetic. A thread turns one pair, in f32;
//! consecutive threads take consecutive pairs of a head, so that loads and stores coalesce.
//!
//! The decode block ([`crate::decode`]) and the Llama step ([`crate::llama`]) fuse the same
//! rotation into their QKV projections; this is the kernel for a framework's own attention.
//!
//! ```no_run
//! # fn main() -> clusterfuse::host::Result<()> {
//! use clusterfuse::{bf16, host::Gpu};
//! use clusterfuse_kernels::rope::host::{rotate, table, Kernels, Shape};
//!
//! let gpu = Gpu::new(0)?;
//! let shape = Shape { tokens: 4, q_heads: 32, kv_heads: 8, head_dim: 128, max_len: 4096 };
//! let (mut q, mut k) = (gpu.zeros::<bf16>(shape.q_len())?, gpu.zeros::<bf16>(shape.k_len())?);
//! let positions = gpu.upload(&[17u32, 18, 19, 20])?;
//! let angles = gpu.upload(&table(shape.max_len, shape.head_dim, 500_000.0))?; // Llama 3's θ
//! rotate(&Kernels::load(&gpu)?, gpu.stream(), shape, &mut q, &mut k, &positions, &angles)?;
//! # Ok(()) }
//! ```

use clusterfuse::prelude::*;

/// Threads per block.
pub const BLOCK: u32 = 256;

/// Turns every pair of `q` and `k` ([module docs](self)): `heads = q_heads + kv_heads` rows
/// of `head_dim` per token, `table` the angles of `table.len() / head_dim` positions.
#[inline(always)]
fn rotate<T: HalfFloat>(q: &Out<T>, k: &Out<T>, positions: &[u32], table: &[f32], q_heads: usize, kv_heads: usize, head_dim: usize) {
    let half = head_dim / 2;
    let tokens = positions.len();
    for i in grid::stride_loop_x(tokens * (q_heads + kv_heads) * half) {
        let (row, pair) = (i / half, i % half);
        let (token, head) = (row / (q_heads + kv_heads), row % (q_heads + kv_heads));
        let angles = positions[token] as usize * head_dim;
        let (cos, sin) = (table[angles + pair], table[angles + half + pair]);
        // Two calls rather than a chosen `&Out`, which would put both in a stack frame.
        if head < q_heads {
            turn(q, (token * q_heads + head) * head_dim + pair, half, cos, sin);
        } else {
            turn(k, (token * kv_heads + head - q_heads) * head_dim + pair, half, cos, sin);
        }
    }
}

/// Turns the pair `(x[i], x[i + half])` by the angle of `cos`, `sin`.
#[inline(always)]
fn turn<T: HalfFloat>(x: &Out<T>, i: usize, half: usize, cos: f32, sin: f32) {
    let (lo, hi) = (x.get(i).to_f32(), x.get(i + half).to_f32());
    x.set(i, T::from_f32(lo * cos - hi * sin));
    x.set(i + half, T::from_f32(hi * cos + lo * sin));
}

macro_rules! rope_kernels {
    ($($t:ident: $name:ident;)*) => {$(
        #[doc = concat!("RoPE of ", stringify!($t), " queries and keys in place ([module docs](self)); `q_heads` of `q`'s heads per token, the rest of the rows `k`'s.")]
        #[kernel(launch_bounds(max_threads = 256))]
        pub fn $name(q: Out<$t>, k: Out<$t>, positions: &[u32], table: &[f32], q_heads: u32, kv_heads: u32, head_dim: u32) {
            rotate(&q, &k, positions, table, q_heads as usize, kv_heads as usize, head_dim as usize)
        }
    )*};
}

rope_kernels! {
    f16: rope_f16;
    bf16: rope_bf16;
}

#[cfg(not(target_arch = "nvptx64"))]
pub mod host;
