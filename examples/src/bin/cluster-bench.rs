//! Cluster benchmark, in-kernel `clock64` timing (kernels in `src/bench.rs`):
//! 1. all-reduce (sum, f32) of n elements per block across clusters of 2-16: `cluster::reduce`
//!    (DSMEM) against the same reduction through global memory and a naive DSMEM version;
//! 2. cluster barrier round trip: `cluster::sync()` against a relaxed arrive;
//! 3. DSMEM read bandwidth from the next block of the cluster, 16-byte loads;
//! 4. DSMEM all-gather bandwidth: remote stores, remote loads and bulk copies.
//!
//! Every launch fills the GPU with one block per SM (enough dynamic shared memory to forbid a
//! second) and as many clusters as can be resident. Cycles are the median over blocks and
//! repetitions (the first repetition dropped as warm-up); µs use the SM clock measured by
//! timing a `clock64` spin with CUDA events. All-reduce results are checked against an f64
//! reference. Prints markdown tables.
//!
//! `cargo run --release -p clusterfuse-examples --bin cluster-bench`

use clusterfuse::host::{Gpu, LaunchConfig};
use clusterfuse_examples::bench::{bench_barrier, bench_dsmem_read, bench_gather, bench_reduce, bench_reduce_global, bench_reduce_naive, bench_spin, gather_mode};
use clusterfuse_examples::check::{random, median, gpu_or_skip};
use std::process::ExitCode;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const REPS: u32 = 21;
const SIZES: [u32; 5] = [2, 3, 4, 8, 16];
const LENGTHS: [usize; 7] = [128, 512, 1024, 4096, 8192, 16384, 32768];
/// Dynamic shared memory that leaves room for only one block per SM.
const ONE_BLOCK_PER_SM: u32 = 116 * 1024;


/// The median of `cycles` (blocks × REPS, rep-major per block), dropping each block's first
/// repetition; fails if any slot was never written.
fn median_cycles(cycles: &[u64], reps: usize) -> Result<u64> {
    if cycles.contains(&u64::MAX) {
        return Err("a block never recorded its cycles".into());
    }
    Ok(median(cycles.chunks(reps).flat_map(|c| c[1..].iter().copied()).collect()))
}

/// The SM clock in MHz: a spin of 2·10⁷ `clock64` cycles timed with CUDA events.
fn sm_clock_mhz(gpu: &Gpu) -> Result<f64> {
    let spin = bench_spin::load(gpu)?;
    let config = LaunchConfig { grid: 1.into(), block: 32.into(), ..LaunchConfig::default() };
    let mut cycles = gpu.upload(&[u64::MAX])?;
    let mut mhz = Vec::new();
    for _ in 0..3 {
        let ms = gpu.time_ms(|| spin.launch(gpu.stream(), &config, &mut cycles, 20_000_000))?;
        mhz.push(gpu.download(&cycles)?[0] as f64 / (ms * 1e3));
    }
    mhz.sort_by(f64::total_cmp);
    Ok(mhz[1])
}

/// One block per SM, as many clusters of `size` as fit at once.
fn fill(kernel: &clusterfuse::host::Kernel, gpu: &Gpu, size: u32, threads: u32, smem: u32) -> Result<LaunchConfig> {
    let mut config = LaunchConfig { grid: size.into(), block: threads.into(), cluster: Some(size.into()), dynamic_smem_bytes: smem, ..LaunchConfig::default() };
    let clusters = kernel.max_active_clusters(gpu.stream(), &kernel.plan(&config)?)?;
    if clusters == 0 {
        return Err(format!("no cluster of {size} blocks with {smem} B of shared memory fits").into());
    }
    config.grid = (clusters * size).into();
    Ok(config)
}

/// Which all-reduce a row times.
#[derive(Clone, Copy, PartialEq)]
enum Variant {
    Dsmem,
    Global,
    Naive,
}

/// Median cycles of one all-reduce variant, or `None` where it does not fit in shared
/// memory; checks the result against the f64 reference.
fn all_reduce(gpu: &Gpu, variant: Variant, size: u32, n: usize) -> Result<Option<u64>> {
    let need = (if variant == Variant::Naive { 2 } else { 1 } * n * 4) as u32;
    if need > gpu.smem_limit() {
        return Ok(None);
    }
    let smem = need.max(ONE_BLOCK_PER_SM);
    let (dsmem, global, naive) = (bench_reduce::load(gpu)?, bench_reduce_global::load(gpu)?, bench_reduce_naive::load(gpu)?);
    let raw = match variant {
        Variant::Dsmem => dsmem.raw(),
        Variant::Global => global.raw(),
        Variant::Naive => naive.raw(),
    };
    let config = fill(raw, gpu, size, 256, smem)?;
    let blocks = config.grid.x as usize;
    let x = random(blocks * n);
    let dx = gpu.upload(&x)?;
    let mut out = gpu.upload(&vec![f32::NAN; blocks * n])?;
    let mut cycles = gpu.upload(&vec![u64::MAX; blocks * REPS as usize])?;
    let stream = gpu.stream();
    match variant {
        Variant::Dsmem => dsmem.launch(stream, &config, &dx, &mut out, &mut cycles, n as u32, REPS)?,
        Variant::Global => {
            let mut scratch = gpu.upload(&vec![f32::NAN; blocks * n])?;
            global.launch(stream, &config, &dx, &mut out, &mut scratch, &mut cycles, n as u32, REPS)?
        }
        Variant::Naive => naive.launch(stream, &config, &dx, &mut out, &mut cycles, n as u32, REPS)?,
    }
    let out = gpu.download(&out)?;
    let size = size as usize;
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (b, row) in out.chunks(n).enumerate() {
        let first = b / size * size;
        for (i, &o) in row.iter().enumerate() {
            let r: f64 = (first..first + size).map(|p| x[p * n + i] as f64).sum();
            diff += (o as f64 - r).powi(2);
            norm += r * r;
        }
    }
    let error = (diff / norm).sqrt();
    if error.is_nan() || error > 1e-6 {
        return Err(format!("all-reduce of {n} over clusters of {size}: relative error {error:.2e}").into());
    }
    Ok(Some(median_cycles(&gpu.download(&cycles)?, REPS as usize)?))
}

fn main() -> ExitCode {
    let Some(gpu) = gpu_or_skip("cluster-bench") else {
        return ExitCode::SUCCESS;
    };
    match run(&gpu) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("cluster-bench failed: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run(gpu: &Gpu) -> Result<()> {
    let mhz = sm_clock_mhz(gpu)?;
    let us = |cycles: u64| cycles as f64 / mhz;
    println!("{} — SM clock {mhz:.0} MHz (clock64 spin timed with CUDA events); one block per SM, GPU filled with clusters", gpu.name()?);
    println!("cycles: median over blocks × {} repetitions (first dropped)\n", REPS - 1);

    println!("## All-reduce (sum, f32), n elements per block, 256 threads\n");
    println!("`cluster::reduce`: DSMEM reduce-scatter + all-gather, 16-byte accesses. global: write to global, cluster barrier,");
    println!("every block sums all peers' vectors from global (16-byte accesses). naive: every block reads every peer's");
    println!("vector with scalar DSMEM loads into a second shared vector. Each has two cluster barriers.\n");
    println!("| n | cluster | `cluster::reduce` cycles | µs | global cycles | naive cycles | speedup vs global |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in LENGTHS {
        for size in SIZES {
            let dsmem = all_reduce(gpu, Variant::Dsmem, size, n)?.ok_or("cluster::reduce does not fit")?;
            let global = all_reduce(gpu, Variant::Global, size, n)?.ok_or("global does not fit")?;
            let naive = all_reduce(gpu, Variant::Naive, size, n)?.map_or("— (2n > smem)".to_string(), |c| c.to_string());
            println!("| {n} | {size} | {dsmem} | {:.2} | {global} | {naive} | {:.2}× |", us(dsmem), global as f64 / dsmem as f64);
        }
    }

    println!("\n## Cluster barrier round trip, 256 threads per block, 1000 back-to-back barriers\n");
    println!("| cluster | `cluster::sync()` cycles | relaxed arrive + wait.acquire cycles |");
    println!("|---:|---:|---:|");
    let barrier = bench_barrier::load(gpu)?;
    const COUNT: u32 = 1000;
    for size in [1, 2, 3, 4, 8, 16] {
        let config = fill(barrier.raw(), gpu, size, 256, ONE_BLOCK_PER_SM)?;
        let mut row = Vec::new();
        for relaxed in [0, 1] {
            let mut cycles = gpu.upload(&vec![u64::MAX; config.grid.x as usize * REPS as usize])?;
            barrier.launch(gpu.stream(), &config, &mut cycles, COUNT, relaxed, REPS)?;
            row.push(median_cycles(&gpu.download(&cycles)?, REPS as usize)? as f64 / COUNT as f64);
        }
        println!("| {size} | {:.0} | {:.0} |", row[0], row[1]);
    }

    println!("\n## DSMEM read bandwidth: each block reads block (rank+1) % size, 1024 threads, 16-byte loads\n");
    println!("| cluster | bytes/cycle/SM | GB/s per SM | GB/s, all SMs |");
    println!("|---:|---:|---:|---:|");
    let read = bench_dsmem_read::load(gpu)?;
    const VECTORS: u32 = 8192;
    const PASSES: u32 = 16;
    for size in [1, 2, 3, 4, 8, 16] {
        let config = fill(read.raw(), gpu, size, 1024, VECTORS * 16)?;
        let blocks = config.grid.x as usize;
        let mut sink = gpu.upload(&vec![0u32; blocks * 1024])?;
        let mut cycles = gpu.upload(&vec![u64::MAX; blocks * REPS as usize])?;
        read.launch(gpu.stream(), &config, &mut sink, &mut cycles, VECTORS, PASSES, REPS)?;
        let per_cycle = (VECTORS * 16 * PASSES) as f64 / median_cycles(&gpu.download(&cycles)?, REPS as usize)? as f64;
        let gbs = per_cycle * mhz / 1e3;
        println!("| {size} | {per_cycle:.1} | {gbs:.0} | {:.0} |", gbs * blocks as f64);
    }

    println!("\n## DSMEM all-gather bandwidth: every block's 16 KB tile into every block of the cluster, 1024 threads\n");
    println!("push: 16-byte remote stores (`cluster::gather`); pull: 16-byte remote loads of every peer's tile (the pattern");
    println!("of example 12's split-K row tail); bulk: one `cp.async.bulk` a peer (`cluster::gather_bulk`). Bytes a block");
    println!("receives from its peers per cycle, each gather timed from a cluster barrier through its closing one.\n");
    println!("| cluster | push bytes/cycle/SM | pull bytes/cycle/SM | bulk bytes/cycle/SM |");
    println!("|---:|---:|---:|---:|");
    let gather = bench_gather::load(gpu)?;
    const TILE_VECTORS: u32 = 1024;
    let m = TILE_VECTORS as usize;
    for size in [2u32, 4, 8] {
        let smem = (size + 1) * TILE_VECTORS * 16 + 16;
        let config = fill(gather.raw(), gpu, size, 1024, smem.max(ONE_BLOCK_PER_SM))?;
        let blocks = config.grid.x as usize;
        // Every block's sink, thread by thread: element i of `all` is rank i / m's vector
        // i % m, [j, !j, rank, C], whose XOR is !rank ^ C.
        let expected: Vec<u32> = (0..1024).map(|t| (t..size as usize * m).step_by(1024).fold(0u32, |a, i| a ^ !(i / m) as u32 ^ 0x9e37_79b9)).collect();
        let mut row = Vec::new();
        for mode in [gather_mode::PUSH, gather_mode::PULL, gather_mode::BULK] {
            let mut sink = gpu.upload(&vec![0u32; blocks * 1024])?;
            let mut cycles = gpu.upload(&vec![u64::MAX; blocks * REPS as usize])?;
            gather.launch(gpu.stream(), &config, &mut sink, &mut cycles, TILE_VECTORS, mode, REPS)?;
            if gpu.download(&sink)?.chunks(1024).any(|block| block != expected.as_slice()) {
                return Err(format!("all-gather mode {mode}, cluster {size}: a block's gathered tiles are wrong").into());
            }
            row.push(((size - 1) * TILE_VECTORS * 16) as f64 / median_cycles(&gpu.download(&cycles)?, REPS as usize)? as f64);
        }
        println!("| {size} | {:.1} | {:.1} | {:.1} |", row[0], row[1], row[2]);
    }
    Ok(())
}
