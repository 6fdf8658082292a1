//! The generator of the synthetic traces in this folder: BERT-base inference (sequence 128,
//! 12 layers of 17 kernels), two forward passes per trace, each ended by a synchronisation.
//!
//! A deterministic model of one stream: the CPU spends ~1.5 µs of framework time and ~2.5 µs
//! in the launch call per kernel (so launches are ~4 µs apart); a kernel starts ~3 µs after
//! its launch call or 0.6 µs after the previous kernel ends, whichever is later, and runs
//! base + per-sample × batch. Small batches leave the GPU waiting for launches; large ones
//! queue kernels behind each other, so TKLQT grows. Regenerate the files with
//! `cargo test -p clusterfuse-host --test trace -- --ignored regenerate`.

use clusterfuse_host::trace::{Event, LaunchRecord, Trace};

/// The batch sizes of the recorded sweep.
pub const BATCHES: [u32; 7] = [1, 2, 4, 8, 16, 32, 64];
const SEQUENCE: u32 = 128;
const HIDDEN: u32 = 768;
const HEADS: u32 = 12;
const PASSES: usize = 2;

/// A kernel's launch shape and GPU time (base + per-sample × batch, ns).
struct Kernel {
    name: &'static str,
    grid: fn(u32) -> [u32; 3],
    block: u32,
    cluster: Option<[u32; 3]>,
    base_ns: u64,
    per_sample_ns: u64,
}

const fn kernel(name: &'static str, grid: fn(u32) -> [u32; 3], block: u32, base_ns: u64, per_sample_ns: u64) -> Kernel {
    Kernel { name, grid, block, cluster: None, base_ns, per_sample_ns }
}

/// A CUTLASS-style sm90 GEMM with `n` output columns, launched in clusters of 2.
const fn gemm(grid: fn(u32) -> [u32; 3], base_ns: u64, per_sample_ns: u64) -> Kernel {
    Kernel { cluster: Some([2, 1, 1]), ..kernel("gemm", grid, 384, base_ns, per_sample_ns) }
}

const PROJECTION: Kernel = gemm(|b| [HIDDEN / 128, b, 1], 1_500, 130);
const FFN_UP: Kernel = gemm(|b| [4 * HIDDEN / 128, b, 1], 1_900, 450);
const FFN_DOWN: Kernel = gemm(|b| [HIDDEN / 128, b, 1], 1_900, 450);
const ELEMENTWISE: fn(u32) -> [u32; 3] = |b| [b * SEQUENCE * HIDDEN / 1024, 1, 1];
const ATTENTION: [Kernel; 6] = [
    kernel("split_heads", ELEMENTWISE, 256, 1_000, 50),
    kernel("bgemm", |b| [1, 1, b * HEADS], 256, 1_400, 100),
    kernel("scale_mask", |b| [b * HEADS * SEQUENCE, 1, 1], 128, 1_000, 50),
    kernel("softmax", |b| [b * HEADS * SEQUENCE / 8, 1, 1], 256, 1_200, 80),
    kernel("bgemm", |b| [1, 1, b * HEADS], 256, 1_400, 100),
    kernel("merge_heads", ELEMENTWISE, 256, 1_000, 50),
];
const RESIDUAL: Kernel = kernel("bias_residual_add", ELEMENTWISE, 256, 1_000, 50);
const LAYER_NORM: Kernel = kernel("layer_norm", |b| [b * SEQUENCE, 1, 1], 256, 1_200, 50);
const GELU: Kernel = kernel("bias_gelu", |b| [4 * b * SEQUENCE * HIDDEN / 1024, 1, 1], 256, 1_100, 170);

/// One forward pass, in launch order.
fn forward() -> Vec<&'static Kernel> {
    const EMBEDDING: Kernel = kernel("embedding_gather", ELEMENTWISE, 256, 1_300, 40);
    const POOLER: Kernel = gemm(|_| [HIDDEN / 128, 1, 1], 1_500, 5);
    const TANH: Kernel = kernel("tanh", |_| [1, 1, 1], 768, 1_000, 0);
    let q_k_v = [&PROJECTION, &PROJECTION, &PROJECTION];
    let layer = q_k_v.into_iter().chain(&ATTENTION).chain([&PROJECTION, &RESIDUAL, &LAYER_NORM, &FFN_UP, &GELU, &FFN_DOWN, &RESIDUAL, &LAYER_NORM]);
    let layer: Vec<&Kernel> = layer.collect();
    let mut pass = vec![&EMBEDDING, &LAYER_NORM];
    (0..12).for_each(|_| pass.extend(&layer));
    pass.extend([&POOLER, &TANH]);
    pass
}

/// SplitMix64: reproducible jitter without a dependency.
struct Jitter(u64);

impl Jitter {
    /// A value in 0..range.
    fn below(&mut self, range: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % range
    }
}

/// The trace of `PASSES` forward passes at `batch`.
pub fn trace(batch: u32) -> Trace {
    let mut jitter = Jitter(u64::from(batch));
    let (mut cpu, mut gpu_free) = (10_000, 0);
    let mut events = Vec::new();
    for _ in 0..PASSES {
        for k in forward() {
            let cpu_call_ns = cpu + 1_300 + jitter.below(400);
            let cpu_return_ns = cpu_call_ns + 2_400 + jitter.below(300);
            let gpu_start_ns = (cpu_call_ns + 2_800 + jitter.below(400)).max(gpu_free + 600);
            let run = k.base_ns + k.per_sample_ns * u64::from(batch);
            let gpu_end_ns = gpu_start_ns + run + jitter.below(run / 32);
            let grid = (k.grid)(batch);
            let (block, cluster) = ([k.block, 1, 1], k.cluster);
            events.push(Event::Launch(LaunchRecord { kernel: k.name.into(), grid, block, cluster, cpu_call_ns, cpu_return_ns, gpu_start_ns, gpu_end_ns }));
            (cpu, gpu_free) = (cpu_return_ns, gpu_end_ns);
        }
        let cpu_ns = cpu.max(gpu_free) + 1_500;
        events.push(Event::Sync { cpu_ns });
        cpu = cpu_ns + 40_000; // tokenising the next request
    }
    Trace { label: format!("bert-base seq {SEQUENCE} batch {batch}"), batch: Some(batch), events }
}

/// This folder's file for `batch`.
pub fn path(batch: u32) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/traces/bert-b{batch:02}.jsonl"))
}
