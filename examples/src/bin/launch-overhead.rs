//! What a launch costs on this platform, same process, same run: an empty kernel launched
//! back to back through raw `cuLaunchKernel`, the typed launcher, the typed launcher as a
//! 2-block cluster (`cuLaunchKernelEx`), the typed launcher under a launch [`Recording`], and
//! as nodes of CUDA graphs of 1, 10 and 100 launches, replayed. Rounds alternate between the
//! paths; each path's median µs per launch (per node, for graphs) over the rounds is
//! reported, wall time of the launches and a final synchronisation, and for graphs also
//! between CUDA events around the replays.
//!
//! `cargo run --release -p clusterfuse-examples --bin launch-overhead`

use clusterfuse::host::cudarc::driver::sys;
use clusterfuse::host::{Gpu, Graph, LaunchConfig, Recording, Result};
use clusterfuse::Dim3;
use clusterfuse_examples::empty::empty;
use clusterfuse_examples::check::{median, gpu_or_skip};
use std::time::Instant;

const LAUNCHES: usize = 20_000;
const ROUNDS: usize = 15;
const GRAPH_SIZES: [usize; 3] = [1, 10, 100];
/// An empty kernel as a node of a CUDA C++ graph on the H200 (shared/TOOLCHAIN.md).
const CUDA_CPP_GRAPH_NODE_US: f64 = 0.50;

/// A measured path: its name, and one round's µs per launch.
type Path<'a> = (String, Box<dyn Fn() -> Result<f64> + 'a>);


/// µs per launch of `launches` calls of `launch`, wall time up to a synchronisation.
fn per_launch(gpu: &Gpu, launches: usize, mut launch: impl FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    for _ in 0..launches {
        launch()?;
    }
    gpu.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e6 / launches as f64)
}

fn main() -> Result<()> {
    let Some(gpu) = gpu_or_skip("launch-overhead") else {
        return Ok(());
    };
    let kernel = empty::load(&gpu)?;
    let stream = gpu.stream();
    let config = LaunchConfig { grid: 1.into(), block: 1.into(), ..LaunchConfig::default() };
    let cluster = LaunchConfig { grid: 2.into(), cluster: Some(Dim3::new(2, 1, 1)), ..config };
    let (function, cu_stream) = match (kernel.raw().cu_function(), stream.cuda()) {
        (Some(function), Some(cuda)) => (function, cuda.cu_stream()),
        _ => unreachable!("Gpu::new opens a GPU"),
    };
    let graphs: Vec<(usize, Graph)> = GRAPH_SIZES
        .iter()
        .map(|&n| Ok((n, gpu.capture(|s| (0..n).try_for_each(|_| kernel.launch(s, &config)))?)))
        .collect::<Result<_>>()?;

    let raw = || {
        per_launch(&gpu, LAUNCHES, || {
            // SAFETY: `empty` takes no parameters; the function and stream are live.
            let status = unsafe {
                sys::cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, cu_stream, std::ptr::null_mut(), std::ptr::null_mut())
            };
            assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
            Ok(())
        })
    };
    let typed = || per_launch(&gpu, LAUNCHES, || kernel.launch(stream, &config));
    let clustered = || per_launch(&gpu, LAUNCHES, || kernel.launch(stream, &cluster));
    let recorded = || {
        let recording = Recording::start(&gpu)?;
        let us = per_launch(&gpu, LAUNCHES, || kernel.launch(stream, &config))?;
        let trace = recording.finish("launch-overhead", None)?;
        assert_eq!(trace.launches().count(), LAUNCHES, "one record per launch");
        Ok(us)
    };
    // SAFETY (replays): `empty` uses no buffers.
    let replayed = |graph: &Graph, n: usize| per_launch(&gpu, LAUNCHES / n, || unsafe { graph.replay(stream) }).map(|us| us / n as f64);
    let replayed_events = |graph: &Graph, n: usize| {
        let replays = LAUNCHES / n;
        let ms = gpu.time_ms(|| (0..replays).try_for_each(|_| unsafe { graph.replay(stream) }))?;
        gpu.synchronize()?;
        Ok(ms * 1e3 / (replays * n) as f64)
    };

    let mut paths: Vec<Path> = vec![
        ("raw `cuLaunchKernel`".into(), Box::new(raw)),
        ("typed `empty::Kernel::launch`".into(), Box::new(typed)),
        ("typed, cluster of 2 (`cuLaunchKernelEx`)".into(), Box::new(clustered)),
        ("typed, recorder on".into(), Box::new(recorded)),
    ];
    for (n, graph) in &graphs {
        assert_eq!(graph.nodes(), *n, "one node per captured launch");
        paths.push((format!("graph of {n}, per node (wall)"), Box::new(move || replayed(graph, *n))));
        paths.push((format!("graph of {n}, per node (events)"), Box::new(move || replayed_events(graph, *n))));
    }

    for (_, path) in &paths {
        path()?; // warm-up: module load, event pool, graph upload
    }
    let mut samples = vec![Vec::new(); paths.len()];
    for round in 0..ROUNDS {
        eprint!("\rround {}/{ROUNDS}", round + 1);
        for ((_, path), samples) in paths.iter().zip(&mut samples) {
            samples.push(path()?);
        }
    }
    eprintln!();

    println!("{} — {ROUNDS} alternating rounds of {LAUNCHES} launches (graph nodes), median µs per launch", gpu.name()?);
    println!("| path | µs / launch (median) | min | max |");
    println!("|---|---|---|---|");
    let mut medians = Vec::new();
    for ((name, _), samples) in paths.iter().zip(&samples) {
        let (min, max) = samples.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        let m = median(samples.clone());
        println!("| {name} | {m:.3} | {min:.3} | {max:.3} |");
        medians.push(m);
    }
    let change = |a: f64, b: f64| (a / b - 1.0) * 100.0;
    println!("typed overhead: {:+.1}% over raw (target: under 5%)", change(medians[1], medians[0]));
    println!("cluster launch: {:+.1}% over typed", change(medians[2], medians[1]));
    println!("recorder on: {:+.1}% over typed", change(medians[3], medians[1]));
    let node = medians[paths.len() - 2];
    println!(
        "graph node (100, wall): {node:.3} µs, {:+.1}% against CUDA C++'s {CUDA_CPP_GRAPH_NODE_US:.2} µs (target: within 10%)",
        change(node, CUDA_CPP_GRAPH_NODE_US)
    );
    Ok(())
}
