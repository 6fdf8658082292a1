//! Runs the examples on the GPU, each against its CPU reference; `-- NAME` runs one.
//! Without a GPU it says so and exits successfully: the PTX was already built and checked
//! by `ptxas` when this binary was built.

use clusterfuse::host::Gpu;
use clusterfuse_examples::EXAMPLES;
use std::process::ExitCode;

fn main() -> ExitCode {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            eprintln!("SKIPPED: the examples' PTX was built and assembled for sm_90, but they were not run: {err}");
            return ExitCode::SUCCESS;
        }
    };
    println!("{}", gpu.name().unwrap_or_default());
    println!("{:<18} {:<44} {:>10} {:>9} {:>9}  result", "example", "shape", "rel error", "tolerance", "unwritten");
    let mut failed = 0;
    for (name, run) in EXAMPLES.iter().filter(|(name, _)| only.is_empty() || only.iter().any(|o| o == name)) {
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
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        eprintln!("{failed} example(s) failed");
        ExitCode::FAILURE
    }
}
