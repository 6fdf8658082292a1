//! What every example's check shares: fresh random inputs, poisoned outputs, and the
//! relative error against an f64 reference.

use clusterfuse::host::{Gpu, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::{Cell, RefCell};
use std::error::Error;

/// Runs one example on a device (a GPU or the emulator) and reports how it compared with its reference.
pub type Runner = fn(&Gpu) -> Result<Report>;

/// One example's outcome.
#[derive(Debug)]
pub struct Report {
    /// What was run, e.g. "n = 1048576".
    pub shape: String,
    /// ‖out − ref‖₂ / ‖ref‖₂.
    pub rel_error: f64,
    /// The bound it must stay under.
    pub tolerance: f64,
    /// Outputs still holding the poison (never written), or NaN.
    pub unwritten: usize,
    /// The outputs themselves, for comparing two devices.
    pub outputs: Vec<f32>,
}

impl Report {
    /// Compares `out` with `reference`.
    pub fn new(shape: String, out: &[f32], reference: &[f64], tolerance: f64) -> Self {
        assert_eq!(out.len(), reference.len(), "output and reference lengths differ");
        let unwritten = out.iter().filter(|v| v.is_nan()).count();
        let (mut diff, mut norm) = (0.0, 0.0);
        for (&o, &r) in out.iter().zip(reference) {
            diff += (o as f64 - r).powi(2);
            norm += r * r;
        }
        let rel_error = if norm == 0.0 { diff.sqrt() } else { (diff / norm).sqrt() };
        Self { shape, rel_error, tolerance, unwritten, outputs: out.to_vec() }
    }

    /// True when every output was written and the error is within tolerance.
    pub fn passed(&self) -> bool {
        self.unwritten == 0 && self.rel_error <= self.tolerance
    }
}

std::thread_local! {
    static RNG: RefCell<StdRng> = RefCell::new(StdRng::from_os_rng());
    static SMALL: Cell<bool> = const { Cell::new(false) };
}

/// `len` values drawn uniformly from `[-1, 1)`, fresh each call (and from a fresh seed each
/// run, unless [`same_inputs`] fixed it).
pub fn random(len: usize) -> Vec<f32> {
    with_rng(|rng| (0..len).map(|_| rng.random_range(-1.0..1.0)).collect())
}

/// Draws from the generator behind [`random`], for inputs of other types.
pub fn with_rng<R>(draw: impl FnOnce(&mut StdRng) -> R) -> R {
    RNG.with_borrow_mut(draw)
}

/// Makes this thread's next examples use the emulator's shapes whatever the device (for
/// runs under `compute-sanitizer`, which are slow at full size).
pub fn small_shapes() {
    SMALL.set(true);
}

/// Makes this thread's next examples draw the inputs of `seed`, at the emulator's shapes
/// whatever the device: how a GPU's and the emulator's outputs are compared.
pub fn same_inputs(seed: u64) {
    RNG.set(StdRng::seed_from_u64(seed));
    small_shapes();
}

/// A device buffer of `len` NaNs: outputs start poisoned so that unwritten elements show.
pub fn poisoned(gpu: &Gpu, len: usize) -> Result<clusterfuse::host::Buffer<f32>> {
    gpu.upload(&vec![f32::NAN; len])
}

/// `on_gpu`, or the smaller `on_emulator` when `gpu` is the CPU emulator, which runs every
/// thread on the host and checks every shared access.
pub fn shape<T>(gpu: &Gpu, on_gpu: T, on_emulator: T) -> T {
    if emulator_shapes(gpu) {
        on_emulator
    } else {
        on_gpu
    }
}

/// Whether [`shape`] picks the emulator's shapes on `gpu`: on the emulator, and on a GPU
/// after [`small_shapes`].
pub fn emulator_shapes(gpu: &Gpu) -> bool {
    gpu.is_emulator() || SMALL.get()
}

/// The SM layout to plan split-K launches for: the GPU's, or `emulator_sms` uniform SMs on
/// the emulator and on a GPU running the emulator's shapes (`--small`, `--agree`), so that
/// both pick the same splits.
pub fn planned_layout(gpu: &Gpu, emulator_sms: usize) -> Result<clusterfuse_kernels::wgmma_gemm::SmLayout> {
    use clusterfuse_kernels::wgmma_gemm::SmLayout;
    if emulator_shapes(gpu) { Ok(SmLayout::uniform(emulator_sms)) } else { SmLayout::planned(gpu, emulator_sms) }
}

/// The device-to-device copy bandwidth of `gpu`'s card, bytes read + written per second
/// (`cuMemcpyDtoD` of 1 GiB, the median of 20 copies after 5): a benchmark's roofline is its
/// bytes over this rate of the card it runs on, not a datasheet's.
pub fn copy_bandwidth(gpu: &Gpu) -> std::result::Result<f64, Box<dyn Error>> {
    const BYTES: usize = 1 << 30;
    let stream = gpu.stream().cuda().ok_or("the copy bandwidth needs a GPU")?;
    let src = stream.alloc_zeros::<u8>(BYTES)?;
    let mut dst = stream.alloc_zeros::<u8>(BYTES)?;
    let us = median_latency_us(gpu, (5, 20), || -> std::result::Result<(), Box<dyn Error>> { Ok(stream.memcpy_dtod(&src, &mut dst)?) })?;
    Ok(2.0 * BYTES as f64 / (us * 1e-6))
}

/// The median of `samples` (the upper one of an even count), for benchmarks.
pub fn median<T: Copy + PartialOrd>(mut samples: Vec<T>) -> T {
    samples.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    samples[samples.len() / 2]
}

/// The median, over `reps` passes after `warmup` discarded ones, of the GPU time of a
/// pass of `calls` back-to-back `call(i)` (`i` in `0..calls`), in µs per call: a call's cost
/// within a stream of them. Each pass is led in by one untimed call (`call(calls - 1)`, as
/// the pass before would end) enqueued before the start event: where the GPU is the
/// bottleneck, it is then busy when the timed calls arrive, and the window does not count
/// the CPU's latency in submitting the first of them; where the CPU is, the GPU waits for
/// each call either way.
pub fn median_us_per_call<E: From<clusterfuse::host::Error>>(
    gpu: &Gpu,
    (warmup, reps): (usize, usize),
    calls: usize,
    mut call: impl FnMut(usize) -> std::result::Result<(), E>,
) -> std::result::Result<f64, E> {
    median_us((warmup, reps), || {
        call(calls - 1)?;
        Ok(gpu.time_ms(|| (0..calls).try_for_each(&mut call))? * 1e3 / calls as f64)
    })
}

/// The median, over `reps` runs after `warmup` discarded ones, of the latency of `run`'s
/// work from an idle GPU: CUDA events around it, so that the window counts the CPU's
/// submission of the work (a graph's launch, say), as a request's latency does.
pub fn median_latency_us<E: From<clusterfuse::host::Error>>(
    gpu: &Gpu,
    (warmup, reps): (usize, usize),
    mut run: impl FnMut() -> std::result::Result<(), E>,
) -> std::result::Result<f64, E> {
    median_us((warmup, reps), || Ok(gpu.time_ms(&mut run)? * 1e3))
}

/// The median of `reps` samples of `sample` (µs) after `warmup` discarded ones.
fn median_us<E>((warmup, reps): (usize, usize), mut sample: impl FnMut() -> std::result::Result<f64, E>) -> std::result::Result<f64, E> {
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..warmup + reps {
        let us = sample()?;
        if rep >= warmup {
            samples.push(us);
        }
    }
    Ok(median(samples))
}

/// Prints a benchmark's table rows, then fails if any row is marked `FAIL` (a variant that
/// did not pass its check before timing).
pub fn print_rows(rows: &[String]) -> std::result::Result<(), String> {
    for row in rows {
        println!("{row}");
    }
    match rows.iter().filter(|r| r.contains("FAIL")).count() {
        0 => Ok(()),
        failures => Err(format!("{failures} variant(s) failed their check")),
    }
}

/// GPU 0 for a benchmark, or `None` after printing why it is skipped (no driver, no device,
/// not Hopper): benchmarks exit successfully without a GPU.
pub fn gpu_or_skip(benchmark: &str) -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(gpu) => Some(gpu),
        Err(err) => {
            println!("SKIPPED ({benchmark} needs a Hopper GPU: {err})");
            None
        }
    }
}
