//! clusterfuse's kernel library: kernels written with clusterfuse, as entry points a host
//! program calls, with typed shapes, shape checks that return
//! [`Error::UnsupportedShape`](clusterfuse::host::Error::UnsupportedShape), and f64 references to
//! test against.
//!
//! - [`gemm`]: `C = epilogue(A·B)` on `mma.sync` from a `cp.async` pipeline, f16 or bf16,
//!   epilogues none / bias / bias + GELU / residual / scale, K split over a cluster at small M.
//! - [`wgmma_gemm`]: `C = epilogue(A·Bᵀ)` on Hopper's `wgmma` fed by TMA (a persistent
//!   producer/consumer pipeline), and split-K kernels that sum partial tiles over DSMEM and can
//!   defer a LayerNorm into the next GEMM.
//! - [`norms`]: LayerNorm(x + b) → GELU and RMSNorm(x + residual) as fused kernels (a block or
//!   a warp a row) and as separate kernels.
//! - [`softmax`]: row softmax, a warp a row.
//! - [`rope`]: rotary position embedding of queries and keys in place (rotate-half, grouped
//!   heads, each token at its own position).
//! - [`bert`]: a BERT-base encoder (post-LN, fp16), unfused or fused, with flash attention
//!   (prefill, on the tensor cores) and an f64 reference.
//! - [`decode`]: the decode step of a Llama attention block (RMSNorm, QKV, RoPE, the KV-cache
//!   append, flash-decoding, the output projection), f16 or bf16, batch 1-8: two launches (a
//!   cluster per head, then the projection), three, five, or one persistent launch.
//! - [`llama`]: a Llama-architecture decode step at batch 1 (bf16 weights and KV cache), as a
//!   CUDA-graph-friendly chain of 82 fused launches ([`llama::chain`]) or as one persistent
//!   launch ([`llama::persistent`]).
//! - [`moe`]: a mixture-of-experts layer at decode (1-64 tokens, bf16): routing by a cluster
//!   top-k over DSMEM, then only the selected experts' SiLU-gated FFNs on tensor cores, the
//!   combine fused into the down projection; two launches, or one (the fused schedule).
// The kernels' docs explain their device code, private helpers included.
#![allow(rustdoc::private_intra_doc_links)]

clusterfuse::embed_ptx!();

/// `body` once for each listed `$i`, unrolled, so that register arrays indexed by `$i` are
/// indexed by constants (a run-time index sends them to local memory; LLVM leaves a loop with
/// a large body rolled). Indices past a generic bound are skipped with `if $i < BOUND`, which
/// each instantiation folds away.
macro_rules! unroll {
    ($i:ident in [$($n:literal)*] $body:block) => {{
        $( { let $i: usize = $n; $body } )*
    }};
}

/// Stamps `%globaltimer` as point `point` of this block's row of `timeline` (`blocks ×
/// points` values; a timeline of one value is off). The one thread that stamps calls it.
#[inline(always)]
fn stamp(timeline: &clusterfuse::global::Out<u64>, points: usize, point: usize) {
    if timeline.len() > 1 {
        timeline.set(clusterfuse::block::index_x() as usize * points + point, clusterfuse::arch::globaltimer());
    }
}

pub mod bert;
pub mod decode;
pub mod gemm;
pub mod llama;
pub mod moe;
pub mod norms;
pub mod rope;
pub mod softmax;
pub mod wgmma_gemm;

/// `len` bf16 values uniform in `lo .. hi`, drawn from `seed` in chunks of 2²⁰ on every core:
/// chunk `i` from its own generator, seeded `seed ^ i·φ` (φ = 2⁶⁴ / the golden ratio), so the
/// values do not depend on the machine, and a tensor of one chunk is the plain stream of `seed`.
#[cfg(not(target_arch = "nvptx64"))]
fn uniform(seed: u64, len: usize, lo: f32, hi: f32) -> Vec<clusterfuse::bf16> {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 20;
    let mut values = vec![clusterfuse::bf16::from_f32(0.0); len];
    values.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = StdRng::seed_from_u64(seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        chunk.iter_mut().for_each(|v| *v = clusterfuse::bf16::from_f32(rng.random_range(lo..hi)));
    });
    values
}
