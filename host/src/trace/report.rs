//! Plain-text tables of summaries, sweeps and fusion advice, and the sweep's plots.

use super::proximity::{advise, AdviceOptions, Chain};
use super::record::Trace;
use super::svg::{Plot, Series};
use super::tklqt::{Bound, Summary, Sweep};

/// One row per trace: its label and batch, then [`Summary`]'s figures in µs.
pub fn summary_table(rows: &[(&Trace, Summary)]) -> String {
    let header = ["trace", "batch"].into_iter().chain(SUMMARY_HEADER);
    let body = rows.iter().map(|(trace, s)| {
        let batch = trace.batch.map_or("-".into(), |b| b.to_string());
        [trace.label.clone(), batch].into_iter().chain(summary_cells(s)).collect()
    });
    table(header, body)
}

/// One row per batch, then the transition from CPU- to GPU-bound.
pub fn sweep_table(sweep: &Sweep) -> String {
    let header = std::iter::once("batch").chain(SUMMARY_HEADER);
    let body = sweep.points().iter().map(|(batch, s)| std::iter::once(batch.to_string()).chain(summary_cells(s)).collect());
    let verdict = match sweep.transition() {
        Some(batch) => format!("transition: GPU-bound from batch {batch} (CPU-bound below)\n"),
        None => "transition: none (no GPU-bound batch after a CPU-bound one)\n".into(),
    };
    table(header, body) + &verdict
}

/// One row per advised chain, best first.
pub fn advice_table(chains: &[Chain]) -> String {
    let header = ["#", "kernels", "occurrences", "score", "launches saved", "idle saved µs", "chain"];
    let body = chains.iter().enumerate().map(|(i, c)| {
        vec![
            (i + 1).to_string(),
            c.kernels.len().to_string(),
            c.occurrences.to_string(),
            format!("{:.3}", c.score()),
            c.launches_saved().to_string(),
            us(c.idle_saved_ns),
            c.kernels.join(" → "),
        ]
    });
    table(header, body)
}

/// The sweep's plots, with file names: TKLQT, and latency (wall time) with GPU busy time,
/// against batch size.
pub fn sweep_plots(sweep: &Sweep) -> [(&'static str, Plot); 2] {
    let series = |name: &str, ns: fn(&Summary) -> u64| Series {
        name: name.into(),
        points: sweep.points().iter().map(|(batch, s)| (f64::from(*batch), ns(s) as f64 / 1e3)).collect(),
    };
    let plot = |title: &str, series| Plot { title: title.into(), x_label: "batch size".into(), y_label: "µs".into(), series };
    let tklqt = vec![series("TKLQT", |s| s.tklqt_ns)];
    let latency = vec![series("latency", |s| s.wall_ns), series("GPU busy", |s| s.gpu_busy_ns)];
    [("tklqt.svg", plot("Total kernel launch and queuing time", tklqt)), ("latency.svg", plot("Latency and GPU busy time", latency))]
}

/// A batch sweep's whole report: one summary row per trace, the sweep table with its
/// CPU-/GPU-bound transition, and the fusion advice for the first trace, as text; and the
/// sweep's plots ([`sweep_plots`]).
pub fn sweep_report(traces: &[Trace], options: &AdviceOptions) -> (String, [(&'static str, Plot); 2]) {
    let rows: Vec<(&Trace, Summary)> = traces.iter().map(|t| (t, Summary::of(t))).collect();
    let sweep = Sweep::new(rows.iter().map(|(t, s)| (t.batch.unwrap_or_default(), *s)));
    let mut text = format!("{}\n{}", summary_table(&rows), sweep_table(&sweep));
    if let Some(first) = traces.first() {
        let batch = first.batch.map_or_else(|| first.label.clone(), |b| format!("batch {b}"));
        text += &format!("\nfusion advice at {batch}:\n{}", advice_table(&advise(first, options)));
    }
    (text, sweep_plots(&sweep))
}

const SUMMARY_HEADER: [&str; 8] =
    ["kernels", "TKLQT µs", "GPU busy µs", "GPU idle µs", "idle %", "avg kernel µs", "wall µs", "bound"];

fn summary_cells(s: &Summary) -> [String; 8] {
    let bound = match s.bound() {
        Bound::Cpu => "CPU",
        Bound::Gpu => "GPU",
    };
    [
        s.kernels.to_string(),
        us(s.tklqt_ns),
        us(s.gpu_busy_ns),
        us(s.gpu_idle_ns),
        format!("{:.1}", 100.0 * s.idle_fraction()),
        us(s.avg_kernel_ns),
        us(s.wall_ns),
        bound.into(),
    ]
}

fn us(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e3)
}

/// Columns padded to their widest cell, two spaces apart; a column of numbers is
/// right-aligned, any other left-aligned.
fn table<'a>(header: impl IntoIterator<Item = &'a str>, body: impl Iterator<Item = Vec<String>>) -> String {
    let rows: Vec<Vec<String>> = std::iter::once(header.into_iter().map(String::from).collect()).chain(body).collect();
    let columns = rows[0].len();
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let numeric = |c: usize| rows.len() > 1 && rows[1..].iter().all(|r| r[c].parse::<f64>().is_ok());
    let layout: Vec<(usize, bool)> = (0..columns).map(|c| (width(c), numeric(c))).collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&layout)
            .map(|(cell, &(w, right))| if right { format!("{cell:>w$}") } else { format!("{cell:<w$}") })
            .collect();
        out += cells.join("  ").trim_end();
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(busy: u64, idle: u64) -> Summary {
        Summary { kernels: 3, tklqt_ns: 9_000, gpu_busy_ns: busy, gpu_idle_ns: idle, avg_kernel_ns: 2_000, wall_ns: 13_000 }
    }

    #[test]
    fn aligns_numbers_right_and_text_left() {
        let trace = Trace { label: "bert".into(), batch: Some(16), events: vec![] };
        let untitled = Trace { label: "x".into(), batch: None, events: vec![] };
        let text = summary_table(&[(&trace, summary(6_000, 4_000)), (&untitled, summary(1_000, 12_000))]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "trace  batch  kernels  TKLQT µs  GPU busy µs  GPU idle µs  idle %  avg kernel µs  wall µs  bound");
        assert_eq!(lines[1], "bert   16           3       9.0          6.0          4.0    40.0            2.0     13.0  GPU");
        assert_eq!(lines[2], "x      -            3       9.0          1.0         12.0    92.3            2.0     13.0  CPU");
    }

    #[test]
    fn a_sweep_report_holds_the_summaries_the_sweep_and_the_first_traces_advice() {
        let traces = [Trace { label: "a".into(), batch: Some(1), events: vec![] }, Trace { label: "b".into(), batch: Some(2), events: vec![] }];
        let (text, plots) = sweep_report(&traces, &AdviceOptions::default());
        assert!(text.starts_with("trace  batch  kernels"), "{text}");
        assert!(text.contains("transition:"), "{text}");
        assert!(text.contains("fusion advice at batch 1:"), "{text}");
        assert_eq!(plots.map(|(name, _)| name), ["tklqt.svg", "latency.svg"]);
    }

    #[test]
    fn a_sweep_table_ends_with_its_transition() {
        let sweep = Sweep::new([(1, summary(1_000, 12_000)), (2, summary(6_000, 4_000))]);
        let text = sweep_table(&sweep);
        assert_eq!(text.lines().count(), 4);
        assert!(text.lines().nth(1).unwrap().starts_with("    1        3"), "{text}");
        assert!(text.ends_with("transition: GPU-bound from batch 2 (CPU-bound below)\n"), "{text}");
        let flat = Sweep::new([(1, summary(6_000, 4_000))]);
        assert!(sweep_table(&flat).ends_with("transition: none (no GPU-bound batch after a CPU-bound one)\n"));
    }

    #[test]
    fn lists_chains_with_their_savings() {
        let chain = Chain { kernels: vec!["a".into(), "b".into(), "c".into()], occurrences: 4, first_launches: 5, idle_saved_ns: 2_500 };
        let text = advice_table(&[chain]);
        assert_eq!(text.lines().nth(1), Some("1        3            4  0.800               8            2.5  a → b → c"), "{text}");
    }

    #[test]
    fn plots_tklqt_and_latency_in_microseconds() {
        let sweep = Sweep::new([(4, summary(6_000, 4_000)), (1, summary(1_000, 12_000))]);
        let [(tklqt_file, tklqt), (latency_file, latency)] = sweep_plots(&sweep);
        assert_eq!((tklqt_file, latency_file), ("tklqt.svg", "latency.svg"));
        assert_eq!(tklqt.series, [Series { name: "TKLQT".into(), points: vec![(1.0, 9.0), (4.0, 9.0)] }]);
        assert_eq!(latency.series.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["latency", "GPU busy"]);
        assert_eq!(latency.series[1].points, [(1.0, 1.0), (4.0, 6.0)]);
    }
}
