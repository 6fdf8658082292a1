//! A Llama-architecture decode step at batch 1: bf16 weights and KV cache, f32 activations
//! and arithmetic, grouped-query attention over heads of 64, RoPE, RMSNorm, a SiLU-gated MLP,
//! the embedding tied to the LM head (Llama-3.2-1B: [`Shape::llama_3_2_1b`]).
//!
//! Two schedules of the same device code:
//! - [`chain`]: 2 + 5 · layers fused kernels, chained by programmatic dependent launch, to be
//!   captured in one CUDA graph ([`chain::host::step`]);
//! - [`persistent`]: one persistent launch whose blocks wait on exactly the tiles they read
//!   ([`persistent::host::step`]).
//!
//! ```no_run
//! # fn main() -> clusterfuse::host::Result<()> {
//! use clusterfuse::host::Gpu;
//! use clusterfuse_kernels::llama::{chain, persistent, Model, Shape};
//!
//! let gpu = Gpu::new(0)?;
//! let model = Model::random(Shape::llama_3_2_1b(1024), 1, 100, 42)?; // seed, position, token
//!
//! // 82 launches:
//! let kernels = chain::host::Kernels::load(&gpu)?;
//! let mut buffers = chain::host::Buffers::upload(&gpu, &model)?;
//! chain::host::step(&kernels, gpu.stream(), &mut buffers, 8, true)?; // clusters of 8, PDL
//!
//! // One launch:
//! let kernel = persistent::llama_step::load(&gpu)?;
//! let mut buffers = persistent::host::Buffers::upload(&gpu, &model)?;
//! let config = persistent::host::config(&kernel, &gpu, model.shape, 8)?;
//! persistent::host::step(&kernel, gpu.stream(), &config, &mut buffers)?;
//! let logits = buffers.results(&gpu, model.position)?;
//! # let _ = logits; Ok(()) }
//! ```

pub mod chain;
pub mod persistent;

#[cfg(not(target_arch = "nvptx64"))]
pub use chain::host::{Model, Reference, Shape, TOLERANCE};
