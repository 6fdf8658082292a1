//! 16 — rotary position embedding of queries and keys in place: the kernel library's
//! [`clusterfuse_kernels::rope`] (rotate-half, one launch for `q` and `k`, grouped-query
//! heads, each token at its own position, angles from an f64 table), checked against f64 in
//! f16 and bf16 at positions up to the table's last.

use crate::check::{random, shape, with_rng, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse::{bf16, f16, HalfFloat};
use clusterfuse_kernels::rope::host::{reference, rotate, table, Kernels, RopeType, Shape};
use rand::Rng;

/// Llama 3's θ.
const THETA: f64 = 500_000.0;

/// One type: Llama-3-8B's heads (32 query, 8 key heads of 128) for 37 tokens at random
/// positions of 32 768 and the last (4 tokens, 4 + 2 heads of 64, 512 positions on the
/// emulator); the rounding of the result to the type bounds the error.
fn check<T: RopeType>(gpu: &Gpu, name: &str, tolerance: f64) -> Result<Report> {
    let (tokens, q_heads, kv_heads, head_dim, max_len) = shape(gpu, (37, 32, 8, 128, 32_768), (4, 4, 2, 64, 512));
    let s = Shape { tokens, q_heads, kv_heads, head_dim, max_len };
    let mut positions: Vec<u32> = with_rng(|rng| (0..tokens).map(|_| rng.random_range(0..max_len as u32)).collect());
    positions[0] = max_len as u32 - 1;
    let halves = |len: usize| -> Vec<T> { random(len).into_iter().map(T::from_f32).collect() };
    let (q, k) = (halves(s.q_len()), halves(s.k_len()));
    let (mut dq, mut dk) = (gpu.upload(&q)?, gpu.upload(&k)?);
    let (dp, dt) = (gpu.upload(&positions)?, gpu.upload(&table(max_len, head_dim, THETA))?);
    rotate(&Kernels::load(gpu)?, gpu.stream(), s, &mut dq, &mut dk, &dp, &dt)?;
    let out: Vec<f32> = gpu.download(&dq)?.into_iter().chain(gpu.download(&dk)?).map(HalfFloat::to_f32).collect();
    let refs: Vec<f64> = reference(&q, &positions, q_heads, head_dim, THETA).into_iter().chain(reference(&k, &positions, kv_heads, head_dim, THETA)).collect();
    Ok(Report::new(format!("{tokens} tokens × ({q_heads} + {kv_heads}) heads of {head_dim}, {max_len} positions, {name}"), &out, &refs, tolerance))
}

/// f16: its rounding (2^-11) of values up to ~1.4.
pub fn run_f16(gpu: &Gpu) -> Result<Report> {
    check::<f16>(gpu, "f16", 1e-3)
}

/// bf16: its rounding (2^-8).
pub fn run_bf16(gpu: &Gpu) -> Result<Report> {
    check::<bf16>(gpu, "bf16", 5e-3)
}
