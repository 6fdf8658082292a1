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
