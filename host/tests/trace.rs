//! The trace analysis on the recorded sweep in `tests/traces/` (synthetic BERT-base traces
//! made by `traces/bert.rs`), through the library and through the `clusterfuse-trace` command.

#[path = "traces/bert.rs"]
mod bert;

use clusterfuse_host::trace::{advise, AdviceOptions, Bound, Summary, Sweep, Trace};
use std::process::{Command, Output};

fn recorded() -> Vec<Trace> {
    bert::BATCHES.iter().map(|&b| Trace::load(bert::path(b)).unwrap()).collect()
}

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_clusterfuse-trace")).args(args).output().unwrap()
}

fn files() -> Vec<String> {
    bert::BATCHES.iter().map(|&b| bert::path(b).display().to_string()).collect()
}

#[test]
#[ignore = "rewrites tests/traces/*.jsonl"]
fn regenerate() {
    for batch in bert::BATCHES {
        bert::trace(batch).save(bert::path(batch)).unwrap();
    }
}

#[test]
fn the_files_are_what_the_generator_writes() {
    for batch in bert::BATCHES {
        let file = std::fs::read_to_string(bert::path(batch)).unwrap();
        assert!(file == bert::trace(batch).to_jsonl(), "bert-b{batch:02}.jsonl is stale: run the `regenerate` test");
    }
}

#[test]
fn small_batches_are_cpu_bound_and_the_transition_is_at_8() {
    let summaries: Vec<(u32, Summary)> = recorded().iter().map(|t| (t.batch.unwrap(), Summary::of(t))).collect();
    let bounds: Vec<Bound> = summaries.iter().map(|(_, s)| s.bound()).collect();
    assert_eq!(bounds, [Bound::Cpu, Bound::Cpu, Bound::Cpu, Bound::Gpu, Bound::Gpu, Bound::Gpu, Bound::Gpu]);
    assert_eq!(Sweep::new(summaries.clone()).transition(), Some(8));
    // Two passes of 2 + 12 × 17 + 2 kernels each.
    assert!(summaries.iter().all(|(_, s)| s.kernels == 2 * 208));
    // While the GPU waits on the CPU, each kernel's TKLQT is just the launch latency
    // (2.8-3.2 µs); once kernels outlast the ~4 µs launch interval they queue and it soars.
    let per_kernel = |i: usize| summaries[i].1.tklqt_ns / summaries[i].1.kernels as u64;
    assert!((2_800..3_200).contains(&per_kernel(0)) && (2_800..3_200).contains(&per_kernel(2)));
    assert!(per_kernel(5) > 50 * per_kernel(0) && per_kernel(6) > 2 * per_kernel(5));
}

#[test]
fn advises_fusing_the_attention_tail_at_batch_1() {
    let trace = &recorded()[0];
    let advice = advise(trace, &AdviceOptions::default());
    let top = &advice[0];
    // Four 8-kernel windows of the layer follow every occurrence of their first kernel and
    // save 24 × 7 launches each; this one spans the shortest kernels, so saves the most idle time.
    let expected = ["scale_mask", "softmax", "bgemm", "merge_heads", "gemm", "bias_residual_add", "layer_norm", "gemm"];
    assert_eq!(top.kernels, expected);
    assert_eq!((top.occurrences, top.score(), top.launches_saved()), (24, 1.0, 168));
    assert!(advice[1..4].iter().all(|c| c.launches_saved() == 168 && c.idle_saved_ns < top.idle_saved_ns));
    assert!(top.idle_saved_ns > 24 * 7 * 2_000, "more than 2 µs idle per saved launch when CPU-bound");
    // The residual add always runs into a layer norm and the next GEMM: 48 occurrences.
    let residual = advice.iter().find(|c| c.kernels == ["bias_residual_add", "layer_norm", "gemm"]).unwrap();
    assert_eq!((residual.occurrences, residual.first_launches), (48, 48));
    // The layer boundary: 11 of 12 FFN activations per pass run into the next layer's attention.
    let boundary = advice.iter().find(|c| c.kernels[0] == "bias_gelu" && c.kernels.len() == 8).unwrap();
    assert_eq!((boundary.occurrences, boundary.first_launches), (22, 24));
}

#[test]
fn the_command_prints_the_sweep_and_writes_well_formed_plots() {
    let dir = std::env::temp_dir().join(format!("clusterfuse-trace-svg-{}", std::process::id()));
    let mut args: Vec<&str> = vec!["sweep", "--svg", dir.to_str().unwrap()];
    let files = files();
    args.extend(files.iter().map(String::as_str));
    let out = cli(&args);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.lines().filter(|l| l.ends_with("CPU")).count(), 3, "{stdout}");
    assert!(stdout.contains("transition: GPU-bound from batch 8 (CPU-bound below)"), "{stdout}");
    for (name, series) in [("tklqt.svg", &["TKLQT"][..]), ("latency.svg", &["latency", "GPU busy"])] {
        let svg = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\"") && svg.ends_with("</svg>\n"), "{name}");
        assert_eq!(svg.matches("<svg").count(), 1, "{name}");
        assert_eq!(svg.matches("<text").count(), svg.matches("</text>").count(), "{name}");
        let polylines: Vec<&str> = svg.lines().filter(|l| l.starts_with("<polyline")).collect();
        assert_eq!(polylines.len(), series.len(), "one per series in {name}");
        assert!(polylines.iter().all(|p| p.split(' ').filter(|w| w.contains(',')).count() == bert::BATCHES.len()));
        assert!(series.iter().all(|s| svg.contains(&format!(">{s}</text>"))), "legend of {name}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_command_advises_and_reports_bad_input() {
    let batch_1 = bert::path(1).display().to_string();
    let out = cli(&["advise", &batch_1, "--max-len", "3"]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success());
    let first = stdout.lines().find(|l| l.starts_with("1 ")).unwrap();
    assert!(first.ends_with("bias_residual_add → layer_norm → gemm"), "{stdout}");

    let missing = cli(&["summary", "/nonexistent/b1.jsonl"]);
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("cannot read trace `/nonexistent/b1.jsonl`"));
    let unknown = cli(&["advise", &batch_1, "--treshold", "0.5"]);
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("unknown option `--treshold`"));
}
