//! Every example on the GPU against its CPU reference. Without a GPU this test says so on
//! stderr and checks nothing (CI has none; scripts/gpu-bundle.sh + scripts/gpu-run.sh run the
//! same checks on a GPU machine).

use clusterfuse::host::Gpu;
use clusterfuse_examples::EXAMPLES;

#[test]
fn examples_match_their_references_on_the_gpu() {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            // Straight to stderr, past the test harness's capture, so the skip is always seen.
            let line = format!("SKIPPED examples_match_their_references_on_the_gpu: {err}\n");
            std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes()).ok();
            return;
        }
    };
    for (name, run) in EXAMPLES {
        let report = run(&gpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(report.passed(), "{name}: {report:?}");
    }
}
