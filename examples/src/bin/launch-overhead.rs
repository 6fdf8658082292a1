//! Launch overhead of the typed launcher against raw `cuLaunchKernel`, same process, same
//! run: an empty kernel, 1 block of 1 thread, launched back to back; rounds alternate between
//! the two paths and the median per-launch time of each is reported.
//!
//! `cargo run --release -p clusterfuse-examples --bin launch-overhead`

use clusterfuse::host::cudarc::driver::sys;
use clusterfuse::host::{Gpu, LaunchConfig, Result};
use clusterfuse_examples::empty::empty;
use std::time::Instant;

const LAUNCHES: usize = 20_000;
const ROUNDS: usize = 15;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            eprintln!("SKIPPED: launch-overhead needs a GPU: {err}");
            return Ok(());
        }
    };
    let kernel = empty::load(&gpu)?;
    let stream = gpu.stream();
    let config = LaunchConfig { grid: 1.into(), block: 1.into(), ..LaunchConfig::default() };
    let (function, cu_stream) = match (kernel.raw().cu_function(), stream.cuda()) {
        (Some(function), Some(cuda)) => (function, cuda.cu_stream()),
        _ => unreachable!("Gpu::new opens a GPU"),
    };

    let raw = || -> Result<f64> {
        let start = Instant::now();
        for _ in 0..LAUNCHES {
            // SAFETY: `empty` takes no parameters; the function and stream are live.
            let status = unsafe {
                sys::cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, cu_stream, std::ptr::null_mut(), std::ptr::null_mut())
            };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        }
        gpu.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64)
    };
    let typed = || -> Result<f64> {
        let start = Instant::now();
        for _ in 0..LAUNCHES {
            kernel.launch(stream, &config)?;
        }
        gpu.synchronize()?;
        Ok(start.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64)
    };

    raw()?;
    typed()?;
    let (mut raws, mut typeds) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        raws.push(raw()?);
        typeds.push(typed()?);
    }
    let (r, t) = (median(raws.clone()), median(typeds.clone()));
    println!("{} — {ROUNDS} alternating rounds of {LAUNCHES} launches, median µs per launch", gpu.name()?);
    println!("| path | µs / launch (median) | min | max |");
    println!("|---|---|---|---|");
    let stats = |v: &[f64]| (v.iter().cloned().fold(f64::INFINITY, f64::min), v.iter().cloned().fold(0.0, f64::max));
    let (rmin, rmax) = stats(&raws);
    let (tmin, tmax) = stats(&typeds);
    println!("| raw `cuLaunchKernel` | {r:.3} | {rmin:.3} | {rmax:.3} |");
    println!("| typed `empty::Kernel::launch` | {t:.3} | {tmin:.3} | {tmax:.3} |");
    println!("typed overhead: {:+.1}% (target: under 5%)", (t / r - 1.0) * 100.0);
    Ok(())
}
