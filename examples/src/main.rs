//! Runs the examples on the GPU, each against its CPU reference; `-- NAME` runs one.
//! Without a GPU it says so and runs them on the CPU emulator instead, with smaller shapes
//! (the PTX was already built and checked by `ptxas` when this binary was built).
//! `--agree` then also runs each on the GPU and on the emulator with the same inputs and
//! compares the two outputs; `--small` uses the emulator's shapes on the GPU too; `--list`
//! prints the examples' names.

use clusterfuse::host::Gpu;
use clusterfuse_examples::check::{same_inputs, small_shapes, Runner};
use clusterfuse_examples::EXAMPLES;
use std::process::ExitCode;

fn main() -> ExitCode {
    let (flags, only): (Vec<String>, Vec<String>) = std::env::args().skip(1).partition(|a| a.starts_with("--"));
    if flags.iter().any(|f| f == "--list") {
        EXAMPLES.iter().for_each(|(name, _)| println!("{name}"));
        return ExitCode::SUCCESS;
    }
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            eprintln!("no GPU ({err}): running the examples on the CPU emulator, with smaller shapes");
            Gpu::emulator()
        }
    };
    if flags.iter().any(|f| f == "--small") {
        small_shapes();
    }
    println!("{}", gpu.name().unwrap_or_default());
    println!("{:<18} {:<44} {:>10} {:>9} {:>9}  result", "example", "shape", "rel error", "tolerance", "unwritten");
    let mut failed = 0;
    let selected: Vec<&(&str, Runner)> = EXAMPLES.iter().filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name)).collect();
    for (name, run) in &selected {
        match run(&gpu) {
            Ok(report) => {
                let verdict = if report.passed() { "ok" } else { "FAIL" };
                failed += usize::from(!report.passed());
                println!(
                    "{name:<18} {:<44} {:>10.2e} {:>9.0e} {:>9}  {verdict}",
                    report.shape, report.rel_error, report.tolerance, report.unwritten
                );
            }
            Err(err) => {
                failed += 1;
                println!("{name:<18} error: {err}");
            }
        }
    }
    if flags.iter().any(|f| f == "--agree") && !gpu.is_emulator() {
        failed += agree(&gpu, &selected);
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{failed} example(s) failed");
        ExitCode::FAILURE
    }
}

/// Runs each example on `gpu` and on the emulator with the same seeded inputs (at the
/// emulator's shapes) and compares the outputs; returns how many disagreed.
fn agree(gpu: &Gpu, examples: &[&(&str, Runner)]) -> usize {
    let emulator = Gpu::emulator();
    println!();
    println!("GPU vs CPU emulator, same inputs");
    println!("{:<18} {:>9} {:>15} {:>12}  result", "example", "outputs", "bitwise equal", "rel diff");
    let mut failed = 0;
    for (seed, (name, run)) in examples.iter().enumerate() {
        same_inputs(seed as u64 + 1);
        let on_gpu = run(gpu);
        same_inputs(seed as u64 + 1);
        let on_emulator = run(&emulator);
        match (on_gpu, on_emulator) {
            (Ok(g), Ok(e)) => {
                let equal = g.outputs.iter().zip(&e.outputs).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
                let (diff, norm) = g.outputs.iter().zip(&e.outputs).fold((0.0, 0.0), |(d, n), (&a, &b)| {
                    (d + (a as f64 - b as f64).powi(2), n + (b as f64).powi(2))
                });
                let rel = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
                let ok = g.outputs.len() == e.outputs.len() && rel <= g.tolerance;
                failed += usize::from(!ok);
                let verdict = if ok { "ok" } else { "DIFFER" };
                println!("{name:<18} {:>9} {:>15} {rel:>12.2e}  {verdict}", g.outputs.len(), equal);
            }
            (g, e) => {
                failed += 1;
                println!("{name:<18} error: gpu {:?}, emulator {:?}", g.err(), e.err());
            }
        }
    }
    failed
}
