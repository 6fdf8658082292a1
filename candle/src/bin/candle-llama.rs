//! A Llama-3.2-1B-shaped model (16 layers, hidden 2048, 32 query and 8 KV heads of 64, MLP
//! 8192, vocabulary 128 256; random bf16 weights) decoding at batch 1 in candle on the GPU:
//! in candle's own CUDA ops, and with clusterfuse's fused kernels swapped in as custom ops on
//! the same candle tensors. Checks each op against candle's ops in f32 on fresh inputs, then
//! one step of both models against the kernel library's f64 reference, then times eager
//! steps of both, interleaved, at two cache lengths (no CUDA graphs: candle has none).
//!
//!     candle-llama [--small]     # --small: 2 layers, fewer steps (for compute-sanitizer)

use candle_core::{DType, Device, Result, Tensor};
use clusterfuse_candle::model::{op_errors, relative_error, Cache, Llama};
use clusterfuse_candle::Kernels;
use clusterfuse_kernels::llama::{Model, Shape, TOLERANCE};
use std::time::Instant;

/// Cached tokens; the step is checked at the last position and timed at two.
const MAX_LEN: usize = 1024;
const POSITIONS: [usize; 2] = [127, MAX_LEN - 1];
/// Copy bandwidth of the H200 measured in this project (results/), for the roofline (a
/// fixed figure: this binary has no measurement of its own, so on another card the column
/// says what the H200 would take).
const BANDWIDTH: f64 = 4.3e12;

fn main() -> Result<()> {
    let small = std::env::args().any(|a| a == "--small");
    let shape = Shape { layers: if small { 2 } else { 16 }, ..Shape::llama_3_2_1b(MAX_LEN) };
    let (passes, steps) = if small { (2, 3) } else { (15, 20) };
    let device = Device::new_cuda(0)?;
    let kernels = Kernels::new(&device)?;
    let position = POSITIONS[1];
    let token = 4242;
    let model = Model::random(shape, 42, position, token).map_err(candle_core::Error::wrap)?;
    let llama = Llama::new(&model, &device)?;
    let reference = llama.to_dtype(DType::F32)?;
    println!("{} layers, hidden {}, {} / {} heads, MLP {}, vocabulary {}; bf16 weights, {} cached tokens\n", shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.inter, shape.vocab, MAX_LEN);

    println!("## Each op against candle's ops in f32 (fresh random h, layer 0, position {})\n\n| op | relative error |\n|---|---|", POSITIONS[0]);
    let mut ok = true;
    for (op, error) in op_errors(&kernels, &model, &llama, &reference, POSITIONS[0])? {
        ok &= error < if op == "appended k, v" { 4e-3 } else { TOLERANCE };
        println!("| {op} | {error:.2e} |");
    }

    println!("\n## One step at position {position}, token {token}: logits and the appended k, v rows\n\n| against | clusterfuse | candle f32 | candle bf16 |\n|---|---|---|---|");
    let f64_reference = Tensor::new(model.reference().all(), &device)?;
    let mut outputs = Vec::new();
    for (llama, fused) in [(&llama, true), (&reference, false), (&llama, false)] {
        let mut cache = Cache::new(&model, &device)?;
        let logits = if fused { llama.clusterfuse_step(&kernels, &mut cache, token, position)? } else { llama.candle_step(&mut cache, token, position)? };
        let rows = cache.k.iter().zip(&cache.v).flat_map(|(k, v)| [k, v]).map(|c| c.narrow(1, position, 1)?.flatten_all()?.to_dtype(DType::F32));
        outputs.push(Tensor::cat(&std::iter::once(Ok(logits)).chain(rows).collect::<Result<Vec<_>>>()?, 0)?);
    }
    let errors = |against: &Tensor| -> Result<Vec<f64>> { outputs.iter().map(|o| relative_error(o, against)).collect() };
    let (vs_f64, vs_candle) = (errors(&f64_reference)?, errors(&outputs[1])?);
    println!("| f64 reference | {:.2e} | {:.2e} | {:.2e} |", vs_f64[0], vs_f64[1], vs_f64[2]);
    println!("| candle f32 | {:.2e} | - | {:.2e} |", vs_candle[0], vs_candle[2]);
    ok &= vs_f64[0] < TOLERANCE && vs_candle[0] < TOLERANCE;
    drop(reference);

    println!("\n## Eager decode steps (µs per step, median of {passes} passes of {steps} steps, wall time to a synchronised GPU)\n");
    println!("| cached tokens | candle (bf16, CUDA) | candle + clusterfuse ops | candle / clusterfuse | roofline at the H200's 4.3 TB/s (µs) |\n|---|---|---|---|---|");
    // Every pass times both paths at every length, so that drift (clocks, allocator pools)
    // falls on all alike; pass 0 warms up.
    let (mut ours, mut theirs) = (Cache::new(&model, &device)?, Cache::new(&model, &device)?);
    let mut times = vec![[Vec::new(), Vec::new()]; POSITIONS.len()];
    for pass in 0..=passes {
        for (&position, times) in POSITIONS.iter().zip(&mut times) {
            for (fused, times) in times.iter_mut().enumerate() {
                device.synchronize()?;
                let start = Instant::now();
                for _ in 0..steps {
                    if fused == 1 {
                        llama.clusterfuse_step(&kernels, &mut ours, token, position)?;
                    } else {
                        llama.candle_step(&mut theirs, token, position)?;
                    }
                }
                device.synchronize()?;
                if pass > 0 {
                    times.push(start.elapsed().as_secs_f64() * 1e6 / steps as f64);
                }
            }
        }
    }
    for (position, times) in POSITIONS.into_iter().zip(times) {
        let [candle, fused] = times.map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        });
        println!("| {} | {candle:.0} | {fused:.0} | {:.2} | {:.0} |", position + 1, candle / fused, shape.step_bytes(position) as f64 / BANDWIDTH * 1e6);
    }
    if !ok {
        return Err(candle_core::Error::Msg(format!("a relative error is over {TOLERANCE:.0e}")));
    }
    Ok(())
}
