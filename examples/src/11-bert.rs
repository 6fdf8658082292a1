//! 11 — a BERT-base encoder (post-LN, fp16) out of the library's kernels, unfused (16
//! launches a layer, as a framework launches them) and fused (5-7 a layer, the chains the
//! proximity advice finds): the kernel library's [`clusterfuse_kernels::bert`] (its docs
//! describe both modes and how each projection picks its GEMM), both modes checked against
//! their f64 references on the same random input and weights.

use crate::check::{planned_layout, random, shape, with_rng, Report};
use clusterfuse::f16;
use clusterfuse::host::{Gpu, Result};
use clusterfuse_kernels::bert::*;
use clusterfuse_kernels::gemm::GemmError;
use clusterfuse_kernels::wgmma_gemm::SmLayout;
use rand::Rng;

/// Runs both modes on the same random input and weights and compares each output with
/// its f64 reference: `dims` at `batch`.
pub fn check(gpu: &Gpu, dims: Dims, batch: usize) -> std::result::Result<Report, GemmError> {
    check_for_layout(gpu, dims, batch, &planned_layout(gpu, EMULATOR_SMS)?)
}

/// [`check`] with the GEMMs picked for a GPU of `layout` ([`Batch::for_layout`]).
pub fn check_for_layout(gpu: &Gpu, dims: Dims, batch: usize, layout: &SmLayout) -> std::result::Result<Report, GemmError> {
    let model = Model::random(gpu, dims, with_rng(|rng| rng.random()))?;
    let kernels = Kernels::load(gpu)?;
    let x: Vec<f16> = random(batch * dims.seq * dims.hidden).into_iter().map(f16::from_f32).collect();
    let (mut outs, mut refs) = (Vec::new(), Vec::new());
    for mode in Mode::ALL {
        let mut b = Batch::for_layout(gpu, &dims, batch, &x, layout)?;
        b.forward(gpu.stream(), &kernels, &model, mode)?;
        outs.extend(gpu.download(b.x())?.iter().map(|v| v.to_f32()));
        refs.extend(reference(&dims, &model.host, &x, mode.gelu()));
    }
    let shape = format!("{} layers, hidden {}, {} heads, ffn {}, batch {batch} × seq {}, unfused + fused", dims.layers, dims.hidden, dims.heads, dims.ffn, dims.seq);
    Ok(Report::new(shape, &outs, &refs, TOLERANCE))
}

/// Example runner: two layers of BERT-base at batch 1 on a GPU, [`TINY`] at batch 2 on the emulator.
pub fn run(gpu: &Gpu) -> Result<Report> {
    let (dims, batch) = shape(gpu, (Dims { layers: 2, ..BERT_BASE }, 1), (TINY, 2));
    check(gpu, dims, batch).map_err(|err| match err {
        GemmError::Launch(err) => err,
        GemmError::Shape(what) => unreachable!("the example's shapes are supported: {what}"),
    })
}
