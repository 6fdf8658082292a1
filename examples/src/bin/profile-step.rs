//! One step of a flagship workload and nothing else, for a profiler: `ncu` times each of its
//! kernels alone (`gpu__time_duration`), which the benchmarks' CUDA-event timings of whole
//! steps cannot. Workloads, with random weights and inputs:
//! - `decode [L]`: example 09's Llama-2-7B attention block at KV length `L` (default 1024),
//!   f16, batch 1 — three spread steps, then two fused steps (clusters of 4);
//! - `bert [BATCH]`: example 11's BERT-base encoder, fused mode, one forward pass (default
//!   batch 1);
//! - `llama`: example 13's Llama-3.2-1B decode step at position 1023 (clusters of 16).
//!
//! Kernels are launched with programmatic dependent launch where the benchmarks use it, so
//! the kernels are the benchmarked ones. Without a GPU it prints SKIPPED and exits successfully.
//!
//! `ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv
//! target/release/profile-step decode 1024` (the figures in `results/decode-h200.md`,
//! `results/bert-h200.md` and `results/llama-h200.md` that name this binary).

use clusterfuse::f16;
use clusterfuse_examples::check::{gpu_or_skip, random, with_rng};
use rand::Rng;
use clusterfuse_kernels::decode::host::{fused, spread, Buffers, DecodeType, Step};
use std::error::Error;

const USAGE: &str = "usage: profile-step decode [L] | bert [BATCH] | llama";

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let (workload, size) = (args.next().ok_or(USAGE)?, args.next().map(|s| s.parse::<usize>()).transpose()?);
    let Some(gpu) = gpu_or_skip("profile-step") else {
        return Ok(());
    };
    match workload.as_str() {
        "decode" => {
            let len = size.unwrap_or(1024);
            let kernels = <f16 as DecodeType>::load(&gpu)?;
            let step = Step::<f16>::random(1, 4096, len, &[len - 1]);
            let mut b = Buffers::upload(&gpu, &step)?;
            for _ in 0..3 {
                spread::<f16>(&kernels, gpu.stream(), &mut b, 4, true)?;
            }
            for _ in 0..2 {
                fused::<f16>(&kernels, gpu.stream(), &mut b, 4, true)?;
            }
        }
        "bert" => {
            use clusterfuse_kernels::bert::{Batch, Kernels, Mode, Model, BERT_BASE};
            let (d, batch) = (BERT_BASE, size.unwrap_or(1));
            let kernels = Kernels::load(&gpu)?;
            let model = Model::random(&gpu, d, with_rng(|rng| rng.random()))?;
            let x: Vec<f16> = random(batch * d.seq * d.hidden).into_iter().map(f16::from_f32).collect();
            Batch::new(&gpu, &d, batch, &x)?.forward(gpu.stream(), &kernels, &model, Mode::Fused)?;
        }
        "llama" => {
            use clusterfuse_kernels::llama::chain::host::{step, Buffers, Kernels};
            use clusterfuse_kernels::llama::{Model, Shape};
            let kernels = Kernels::load(&gpu)?;
            let model = Model::random(Shape::llama_3_2_1b(1024), 1, 1023, 128_000)?;
            step(&kernels, gpu.stream(), &mut Buffers::upload(&gpu, &model)?, 16, true)?;
        }
        _ => return Err(USAGE.into()),
    }
    Ok(gpu.synchronize()?)
}
