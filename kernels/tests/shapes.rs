//! The dense entry points refuse shapes their kernels cannot take, before launching, with the
//! reason: on the emulator, so without a GPU.

use clusterfuse::host::{Error, Gpu};
use clusterfuse::f16;
use clusterfuse_kernels::bert::{Batch, Dims, TINY};
use clusterfuse_kernels::gemm::{self, GemmError};
use clusterfuse_kernels::llama::{chain, persistent, Model, Shape};
use clusterfuse_kernels::norms::{Fused, MAX_HIDDEN};
use clusterfuse_kernels::softmax;

fn reason(result: clusterfuse::host::Result<()>) -> String {
    match result {
        Err(Error::UnsupportedShape { reason, .. }) => reason,
        other => panic!("expected UnsupportedShape, got {other:?}"),
    }
}

#[test]
fn norms_refuse_hidden_sizes_and_short_buffers() {
    let gpu = Gpu::emulator();
    let fused = Fused::load(&gpu).unwrap();
    let buffer = |len: usize| gpu.upload(&vec![f16::ZERO; len]).unwrap();
    for hidden in [0, 100, MAX_HIDDEN + 256] {
        let (x, r, w) = (buffer(2 * 9000), buffer(2 * 9000), buffer(9000));
        let (mut res, mut out) = (buffer(2 * 9000), buffer(2 * 9000));
        let why = reason(fused.add_rmsnorm(gpu.stream(), false, &x, &r, &w, &mut res, &mut out, hidden, 2));
        assert!(why.contains(&format!("hidden {hidden}")), "{why}");
    }
    let (x, b, gamma, beta, mut out) = (buffer(2 * 256), buffer(128), buffer(256), buffer(256), buffer(2 * 256));
    let why = reason(fused.layernorm_gelu(gpu.stream(), false, &x, &b, &gamma, &beta, &mut out, 256, 2));
    assert!(why.contains("parameter buffer holds 128"), "{why}");
    let (x, b, mut out) = (buffer(256), buffer(256), buffer(2 * 256));
    let why = reason(fused.layernorm_gelu(gpu.stream(), false, &x, &b, &gamma, &beta, &mut out, 256, 2));
    assert!(why.contains("activation buffer holds 256"), "{why}");
}

#[test]
fn softmax_refuses_rows_of_other_than_whole_vectors() {
    let gpu = Gpu::emulator();
    let kernel = softmax::softmax::load(&gpu).unwrap();
    let (x, mut out) = (gpu.upload(&[0.0f32; 60]).unwrap(), gpu.zeros::<f32>(60).unwrap());
    assert!(reason(softmax::launch(&kernel, gpu.stream(), &x, &mut out, 2, 30)).contains("multiple of 4"));
    assert!(reason(softmax::launch(&kernel, gpu.stream(), &x, &mut out, 4, 16)).contains("needs 64 values"));
}

#[test]
fn gemms_refuse_k_off_whole_vectors_and_bert_refuses_other_heads() {
    match gemm::config(64, 64, 36) {
        Err(GemmError::Shape(why)) => assert!(why.contains("N and K must be multiples of 8"), "{why}"),
        Err(other) => panic!("expected a shape error, got {other}"),
        Ok(_) => panic!("K = 36 was accepted"),
    }
    assert!(gemm::config(64, 64, 64).is_ok());
    let dims = Dims { hidden: 320, ..TINY };
    assert!(dims.check().unwrap_err().contains("is not heads 4 × 64"));
    let gpu = Gpu::emulator();
    match Batch::new(&gpu, &TINY, 1, &[f16::ZERO; 7]) {
        Err(GemmError::Shape(why)) => assert!(why.contains("the input holds 7 values"), "{why}"),
        Err(other) => panic!("expected a shape error, got {other}"),
        Ok(_) => panic!("a 7-value input was accepted"),
    }
}

#[test]
fn llama_steps_refuse_models_whose_arrays_do_not_fit_the_shape() {
    let gpu = Gpu::emulator();
    let model = || Model::random(Shape::tiny(), 5, 3, 7).unwrap();
    let refusals = |model: Model| {
        let chain = reason(chain::host::Buffers::upload(&gpu, &model).map(|_| ()));
        assert_eq!(chain, reason(persistent::host::Buffers::upload(&gpu, &model).map(|_| ())));
        chain
    };
    chain::host::Buffers::upload(&gpu, &model()).unwrap();
    persistent::host::Buffers::upload(&gpu, &model()).unwrap();
    let mut short = model();
    short.layers[1].w_o.pop();
    assert_eq!(refusals(short), "layer 1's `w_o` holds 65535 values; the shape needs 65536");
    let mut uncached = model();
    uncached.k_cache.pop();
    assert_eq!(refusals(uncached), "2 layers, 1 k caches and 2 v caches for a shape of 2 layers");
    let (mut past, mut unknown) = (model(), model());
    past.position = past.shape.max_len;
    assert!(refusals(past).contains("at position 64"));
    unknown.token = 1000;
    assert!(refusals(unknown).starts_with("token 1000"));
}
