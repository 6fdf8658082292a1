//! clusterfuse's kernel library: kernels written with clusterfuse, as entry points a host
//! program calls, with typed shapes, shape checks that return
//! [`Error::UnsupportedShape`](clusterfuse::host::Error::UnsupportedShape), and f64 references to
//! test against.
//!
//! - [`decode`]: the decode step of a Llama attention block (RMSNorm, QKV, RoPE, the KV-cache
//!   append, flash-decoding, the output projection), f16 or bf16, batch 1-8: two launches (a
//!   cluster per head, then the projection), three, five, or one persistent launch.
//! - [`llama`]: a Llama-architecture decode step at batch 1 (bf16 weights and KV cache), as a
//!   CUDA-graph-friendly chain of 82 fused launches ([`llama::chain`]) or as one persistent
//!   launch ([`llama::persistent`]).
//! - [`moe`]: a mixture-of-experts layer at decode (1-64 tokens, bf16): routing by a cluster
//!   top-k over DSMEM, then only the selected experts' SiLU-gated FFNs on tensor cores, the
//!   combine fused into the down projection; two launches.
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

pub mod decode;
pub mod llama;
pub mod moe;

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
