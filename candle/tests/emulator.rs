//! The ops on CPU tensors, run by the CPU emulator, against candle's own CPU ops (f32) and the
//! kernel library's f64 reference, at the library's tiny Llama shape (2 layers, hidden 256,
//! 4 query and 2 KV heads, MLP 4096, vocabulary 1000, 64 cached tokens).

use candle_core::{DType, Device, Result, Tensor};
use clusterfuse_candle::model::{op_errors, relative_error, Cache, Llama};
use clusterfuse_candle::Kernels;
use clusterfuse::bf16;
use clusterfuse::host::{Buffer, Gpu};
use clusterfuse_kernels::llama::chain::{host::projection_config, llama_residual};
use clusterfuse_kernels::llama::{Model, Shape, TOLERANCE};

fn model(position: usize, token: u32) -> Result<Model> {
    Model::random(Shape::tiny(), 11, position, token).map_err(candle_core::Error::wrap)
}

/// The logits, then each layer's appended k and v rows: the order of the library's reference.
fn results(logits: &Tensor, cache: &Cache, position: usize) -> Result<Tensor> {
    let rows = cache.k.iter().zip(&cache.v).flat_map(|(k, v)| [k, v]).map(|c| c.narrow(1, position, 1)?.flatten_all()?.to_dtype(DType::F32));
    Tensor::cat(&std::iter::once(Ok(logits.clone())).chain(rows).collect::<Result<Vec<_>>>()?, 0)
}

#[test]
fn each_op_matches_candle_on_fresh_inputs() -> Result<()> {
    let device = Device::Cpu;
    let kernels = Kernels::new(&device)?;
    let model = model(29, 0)?;
    let llama = Llama::new(&model, &device)?;
    for (op, error) in op_errors(&kernels, &model, &llama, &llama.to_dtype(DType::F32)?, 29)? {
        // The appended rows are bf16: equal, or one rounding apart.
        let tolerance = if op == "appended k, v" { 4e-3 } else { TOLERANCE };
        assert!(error < tolerance, "{op}: relative error {error:.2e} against candle (f32), over {tolerance:.0e}");
    }
    Ok(())
}

#[test]
fn a_decode_step_matches_candle_and_the_f64_reference() -> Result<()> {
    let (device, position, token) = (Device::Cpu, 37, 123);
    let model = model(position, token)?;
    let llama = Llama::new(&model, &device)?;
    let (mut ours, mut theirs) = (Cache::new(&model, &device)?, Cache::new(&model, &device)?);
    let logits = llama.clusterfuse_step(&Kernels::new(&device)?, &mut ours, token, position)?;
    let expected = llama.to_dtype(DType::F32)?.candle_step(&mut theirs, token, position)?;
    let reference = Tensor::new(model.reference().all(), &device)?;
    let ours = results(&logits, &ours, position)?;
    let theirs = results(&expected, &theirs, position)?;
    for (what, error) in [("clusterfuse", relative_error(&ours, &reference)?), ("candle f32", relative_error(&theirs, &reference)?), ("clusterfuse vs candle", relative_error(&ours, &theirs)?)] {
        assert!(error < TOLERANCE, "{what}: relative error {error:.2e} over {TOLERANCE:.0e}");
    }
    Ok(())
}

#[test]
fn consecutive_steps_from_an_empty_cache_match_candle() -> Result<()> {
    let device = Device::Cpu;
    let model = model(0, 0)?;
    let (llama, kernels) = (Llama::new(&model, &device)?, Kernels::new(&device)?);
    let reference = llama.to_dtype(DType::F32)?;
    let (mut ours, mut theirs) = (Cache::new(&model, &device)?, Cache::new(&model, &device)?);
    for (position, token) in [(0, 5), (1, 999), (2, 5)] {
        let logits = llama.clusterfuse_step(&kernels, &mut ours, token, position)?;
        let error = relative_error(&logits, &reference.candle_step(&mut theirs, token, position)?)?;
        assert!(error < TOLERANCE, "step at {position}: relative error {error:.2e} over {TOLERANCE:.0e}");
    }
    Ok(())
}

#[test]
fn wrong_dtypes_shapes_and_devices_are_refused_before_launching() -> Result<()> {
    let device = Device::Cpu;
    let kernels = Kernels::new(&device)?;
    let h = Tensor::zeros(256, DType::F32, &device)?;
    let norm_w = Tensor::ones(256, DType::BF16, &device)?;
    let refused = |r: Result<Tensor>, words: &str| match r {
        Err(e) => assert!(e.to_string().contains(words), "`{e}` does not say `{words}`"),
        Ok(_) => panic!("accepted; expected an error saying `{words}`"),
    };
    refused(kernels.gate_up(&h.to_dtype(DType::BF16)?, &norm_w, &Tensor::zeros((512, 256), DType::BF16, &device)?), "expected a F32 tensor");
    refused(kernels.gate_up(&h, &norm_w, &Tensor::zeros((512, 256), DType::F32, &device)?), "expected a BF16 tensor");
    refused(kernels.lm_head(&h, &norm_w, &Tensor::zeros((7, 256), DType::BF16, &device)?), "even number of rows");
    let odd = Tensor::zeros(12, DType::F32, &device)?;
    refused(kernels.gate_up(&odd, &Tensor::ones(12, DType::BF16, &device)?, &Tensor::zeros((8, 12), DType::BF16, &device)?), "16-byte vectors");
    // 8 query heads over 1 KV head.
    let (h, norm_w) = (Tensor::zeros(512, DType::F32, &device)?, Tensor::ones(512, DType::BF16, &device)?);
    let (k_cache, v_cache) = (Tensor::zeros((1, 8, 64), DType::BF16, &device)?, Tensor::zeros((1, 8, 64), DType::BF16, &device)?);
    let rope = Tensor::zeros((8, 64), DType::F32, &device)?;
    let position = Tensor::new(&[0u32], &device)?;
    let w_qkv = Tensor::zeros((512 + 128, 512), DType::BF16, &device)?;
    refused(kernels.attention(&h, &norm_w, &w_qkv, &rope, &position, &k_cache, &v_cache), "each KV head serves 1 to 4");
    Ok(())
}

/// What the CUDA path does with candle's memory, on the emulator: a kernel launched on
/// memory the buffers borrow (`Buffer::from_raw`) reads and writes it in place.
#[test]
fn a_kernel_launches_on_borrowed_memory() -> clusterfuse::host::Result<()> {
    let gpu = Gpu::emulator();
    let (n, k) = (64, 256);
    let w: Vec<bf16> = (0..n * k).map(|i| bf16::from_f32(((i * 7) % 13) as f32 / 13.0 - 0.5)).collect();
    let mut x: Vec<f32> = (0..k).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut h = vec![1.0f32; n];
    let expected: Vec<f64> = w.chunks(k).map(|row| 1.0 + row.iter().zip(&x).map(|(w, x)| w.to_f64() * *x as f64).sum::<f64>()).collect();
    // SAFETY: host memory for the emulator, alive and used by nothing else until the buffers
    // are dropped after the launch (which the emulator runs to completion).
    let (mut xb, wb, mut hb) = unsafe {
        (Buffer::from_raw(gpu.stream(), x.as_mut_ptr() as u64, k), Buffer::<bf16>::from_raw(gpu.stream(), w.as_ptr() as u64, n * k), Buffer::from_raw(gpu.stream(), h.as_mut_ptr() as u64, n))
    };
    llama_residual::load(&gpu)?.launch(gpu.stream(), &projection_config(n / 2, k, 4, false), &mut xb, &wb, &mut hb)?;
    drop((xb, wb, hb));
    for (i, (h, e)) in h.iter().zip(&expected).enumerate() {
        assert!((*h as f64 - e).abs() < 1e-4 * e.abs().max(1.0), "h[{i}] = {h}, expected {e}");
    }
    Ok(())
}
