//! clusterfuse's graded examples. Each file is one lesson: a kernel, the CPU reference it is
//! checked against (in f64), and (on the host) a `run` that checks it on the GPU with fresh
//! random inputs and poisoned outputs. `cargo run --release -p clusterfuse-examples` runs them all.
// The lessons are read as source, their helpers with them: their docs link private items.
#![allow(rustdoc::private_intra_doc_links)]

clusterfuse::embed_ptx!();

#[path = "00-empty.rs"]
pub mod empty;
#[path = "01-saxpy.rs"]
pub mod saxpy;
#[path = "02-block-reduce.rs"]
pub mod block_reduce;
#[path = "03-dynamic-smem.rs"]
pub mod dynamic_smem;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "04-softmax.rs"]
pub mod softmax;
#[path = "05-cluster-collectives.rs"]
pub mod cluster_collectives;
#[path = "06-cluster-dtypes.rs"]
pub mod cluster_dtypes;
#[path = "07-cluster-primitive.rs"]
pub mod cluster_primitive;

#[cfg(not(target_arch = "nvptx64"))]
#[path = "08-fused-norms.rs"]
pub mod fused_norms;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "09-decode-attention.rs"]
pub mod decode_attention;
#[path = "10-gemm.rs"]
pub mod gemm;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "11-bert.rs"]
pub mod bert;
#[path = "12-wgmma-gemm.rs"]
pub mod wgmma_gemm;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "13-llama-decode.rs"]
pub mod llama_decode;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "14-persistent-llama.rs"]
pub mod persistent_llama;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "15-moe.rs"]
pub mod moe;
#[cfg(not(target_arch = "nvptx64"))]
#[path = "16-rope.rs"]
pub mod rope;

/// Kernels of the `cluster-bench` benchmark.
pub mod bench;

pub mod faults;

#[cfg(not(target_arch = "nvptx64"))]
pub mod check;

/// Every example, in teaching order: (name, runner).
#[cfg(not(target_arch = "nvptx64"))]
pub const EXAMPLES: &[(&str, check::Runner)] = &[
    ("01-saxpy", saxpy::run),
    ("02-block-reduce", block_reduce::run),
    ("03-dynamic-smem", dynamic_smem::run),
    ("04-softmax", softmax::run),
    ("05-cluster", cluster_collectives::run),
    ("06-f32-sums", cluster_dtypes::f32_sums),
    ("06-f32-exact", cluster_dtypes::f32_exact),
    ("06-f16-sums", cluster_dtypes::f16_sums),
    ("06-f16-exact", cluster_dtypes::f16_exact),
    ("06-bf16-sums", cluster_dtypes::bf16_sums),
    ("06-bf16-exact", cluster_dtypes::bf16_exact),
    ("06-i32-sums", cluster_dtypes::i32_sums),
    ("06-i32-exact", cluster_dtypes::i32_exact),
    ("07-primitive", cluster_primitive::run),
    ("08-fused-norms", fused_norms::run),
    ("09-decode-attention", decode_attention::run),
    ("09-decode-bf16", decode_attention::run_bf16),
    ("09-decode-batch", decode_attention::run_batch),
    ("10-mma-tile", gemm::run_tile),
    ("10-gemm-f16", gemm::f16_plain),
    ("10-gemm-f16-bias", gemm::f16_bias),
    ("10-gemm-f16-gelu", gemm::f16_bias_gelu),
    ("10-gemm-f16-resid", gemm::f16_residual),
    ("10-gemm-f16-scale", gemm::f16_scale),
    ("10-gemm-bf16", gemm::bf16_plain),
    ("10-gemm-bf16-bias", gemm::bf16_bias),
    ("10-gemm-bf16-gelu", gemm::bf16_bias_gelu),
    ("10-gemm-bf16-resid", gemm::bf16_residual),
    ("10-gemm-bf16-scale", gemm::bf16_scale),
    ("11-bert", bert::run),
    ("12-tma-box", wgmma_gemm::run_tma_box),
    ("12-wgmma-bf16", wgmma_gemm::plain),
    ("12-wgmma-bf16-bias", wgmma_gemm::bias),
    ("12-wgmma-bf16-gelu", wgmma_gemm::bias_gelu),
    ("12-wgmma-bf16-resid", wgmma_gemm::residual),
    ("12-wgmma-bf16-scale", wgmma_gemm::scale),
    ("12-wgmma-f16", wgmma_gemm::f16_plain),
    ("12-wgmma-f16-bias", wgmma_gemm::f16_bias),
    ("12-wgmma-f16-gelu", wgmma_gemm::f16_bias_gelu),
    ("12-wgmma-f16-resid", wgmma_gemm::f16_residual),
    ("12-wgmma-f16-scale", wgmma_gemm::f16_scale),
    ("12-split-f16", wgmma_gemm::split_f16_plain),
    ("12-split-f16-bias", wgmma_gemm::split_f16_bias),
    ("12-split-f16-gelu", wgmma_gemm::split_f16_bias_gelu),
    ("12-split-f16-resid", wgmma_gemm::split_f16_residual),
    ("12-split-f16-ln", wgmma_gemm::run_split_k_layer_norm),
    ("13-llama-decode", llama_decode::run),
    ("14-persistent-llama", persistent_llama::run),
    ("15-moe", moe::run),
    ("15-moe-fused", moe::run_fused),
    ("16-rope-f16", rope::run_f16),
    ("16-rope-bf16", rope::run_bf16),
];
