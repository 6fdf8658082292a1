//! Fusion advice by proximity score: chains of kernels that reliably follow their first kernel.

use super::record::{Event, LaunchRecord, Trace};
use std::collections::HashMap;

/// What [`advise`] reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdviceOptions {
    /// Least proximity score reported.
    pub threshold: f64,
    /// Longest chain considered, in kernels.
    pub max_len: usize,
}

impl Default for AdviceOptions {
    /// Score at least 0.9, chains of up to 8 kernels.
    fn default() -> Self {
        Self { threshold: 0.9, max_len: 8 }
    }
}

/// A chain of kernels launched back to back, and what fusing it into one kernel would save.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chain {
    /// The kernels' names, in launch order.
    pub kernels: Vec<String>,
    /// Non-overlapping occurrences, counted left to right within each segment.
    pub occurrences: usize,
    /// Launches of the chain's first kernel in the whole trace.
    pub first_launches: usize,
    /// Σ over occurrences of the GPU gaps between consecutive kernels of the occurrence.
    pub idle_saved_ns: u64,
}

impl Chain {
    /// Proximity score: occurrences of the chain / launches of its first kernel.
    pub fn score(&self) -> f64 {
        self.occurrences as f64 / self.first_launches as f64
    }

    /// occurrences × (length − 1).
    pub fn launches_saved(&self) -> usize {
        self.occurrences * (self.kernels.len() - 1)
    }
}

#[derive(Default)]
struct Tally {
    occurrences: usize,
    idle_ns: u64,
    /// Segment and end index of the last counted occurrence.
    last: Option<(usize, usize)>,
}

/// The chains of 2..=`max_len` kernels worth fusing in `trace`: score ≥ `threshold` and at least
/// 2 occurrences. Chains never cross a [`Event::Sync`]. A chain inside a longer reported one
/// with the same occurrences and score is left out. Sorted by launches saved, then idle time
/// saved (both descending), then by name.
pub fn advise(trace: &Trace, options: &AdviceOptions) -> Vec<Chain> {
    let segments = segments(trace);
    let names: Vec<Vec<&str>> = segments.iter().map(|s| s.iter().map(|l| l.kernel.as_str()).collect()).collect();
    let mut launches: HashMap<&str, usize> = HashMap::new();
    for &name in names.iter().flatten() {
        *launches.entry(name).or_default() += 1;
    }
    let mut tallies: HashMap<&[&str], Tally> = HashMap::new();
    for (seg, (kernels, names)) in segments.iter().zip(&names).enumerate() {
        for start in 0..names.len() {
            for end in start + 2..=names.len().min(start + options.max_len) {
                let tally = tallies.entry(&names[start..end]).or_default();
                if tally.last.is_some_and(|(s, e)| s == seg && start < e) {
                    continue;
                }
                tally.occurrences += 1;
                let gaps = kernels[start..end].windows(2).map(|w| w[1].gpu_start_ns.saturating_sub(w[0].gpu_end_ns));
                tally.idle_ns += gaps.sum::<u64>();
                tally.last = Some((seg, end));
            }
        }
    }
    let candidates: Vec<Chain> = tallies
        .into_iter()
        .map(|(kernels, tally)| Chain {
            kernels: kernels.iter().map(|&k| k.to_owned()).collect(),
            occurrences: tally.occurrences,
            first_launches: launches[kernels[0]],
            idle_saved_ns: tally.idle_ns,
        })
        .filter(|c| c.occurrences >= 2 && c.score() >= options.threshold)
        .collect();
    let mut chains: Vec<Chain> = candidates.iter().filter(|c| !subsumed(c, &candidates)).cloned().collect();
    chains.sort_by(|a, b| {
        (b.launches_saved(), b.idle_saved_ns, &a.kernels).cmp(&(a.launches_saved(), a.idle_saved_ns, &b.kernels))
    });
    chains
}

/// Whether a longer candidate contains `chain` with the same occurrences and score.
fn subsumed(chain: &Chain, candidates: &[Chain]) -> bool {
    candidates.iter().any(|longer| {
        longer.kernels.len() > chain.kernels.len()
            && (longer.occurrences, longer.first_launches) == (chain.occurrences, chain.first_launches)
            && longer.kernels.windows(chain.kernels.len()).any(|w| w == chain.kernels.as_slice())
    })
}

/// The launches between synchronisations, empty runs dropped.
fn segments(trace: &Trace) -> Vec<Vec<&LaunchRecord>> {
    let runs = trace.events.split(|event| matches!(event, Event::Sync { .. }));
    runs.map(|run| run.iter().filter_map(Event::as_launch).collect::<Vec<_>>()).filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Launches `names` (one letter each, `|` a sync) 4 µs apart, each running 1 µs, with
    /// `extra` µs more idle time before every `C`.
    fn trace(names: &str, extra: u64) -> Trace {
        let mut t = 0;
        let events = names
            .chars()
            .filter(|c| !c.is_whitespace())
            .map(|c| {
                t += 4_000;
                if c == '|' {
                    return Event::Sync { cpu_ns: t };
                }
                let delay = if c == 'C' { extra * 1000 } else { 0 };
                t += delay;
                Event::Launch(LaunchRecord {
                    kernel: c.to_string(),
                    grid: [1; 3],
                    block: [1; 3],
                    cluster: None,
                    cpu_call_ns: t - 1_000,
                    cpu_return_ns: t,
                    gpu_start_ns: t,
                    gpu_end_ns: t + 1_000,
                })
            })
            .collect();
        Trace { label: "t".into(), batch: None, events }
    }

    fn names(chains: &[Chain]) -> Vec<(String, usize, usize)> {
        chains.iter().map(|c| (c.kernels.concat(), c.occurrences, c.first_launches)).collect()
    }

    #[test]
    fn scores_chains_by_how_reliably_they_follow_their_first_kernel() {
        // A B C | A B C | A B D: `A B` follows every A (3/3); `A B C` two of three (2/3).
        let t = trace("ABC|ABC|ABD", 0);
        let all = advise(&t, &AdviceOptions { threshold: 0.0, ..AdviceOptions::default() });
        let find = |k: &str| all.iter().find(|c| c.kernels.concat() == k).map(Chain::score);
        assert_eq!(find("AB"), Some(1.0));
        assert_eq!(find("ABC"), Some(2.0 / 3.0));
        assert_eq!(find("BC"), None, "B C (2 occurrences, 2/3) is inside A B C with the same figures");
        assert_eq!(find("BD"), None, "one occurrence");
        assert_eq!(find("CA"), None, "chains do not cross a sync");
        // At the default threshold only `A B` is left: 3 launches saved.
        let advised = advise(&t, &AdviceOptions::default());
        assert_eq!(names(&advised), [("AB".to_string(), 3, 3)]);
        assert_eq!(advised[0].launches_saved(), 3);
    }

    #[test]
    fn sums_the_gpu_gaps_inside_each_occurrence() {
        // Kernels run 1 µs and launch 4 µs apart: a 3 µs gap, 5 µs more before each C.
        let advised = advise(&trace("ABC|ABC", 5), &AdviceOptions::default());
        assert_eq!(names(&advised), [("ABC".to_string(), 2, 2)], "A B and B C are inside A B C");
        assert_eq!((advised[0].launches_saved(), advised[0].idle_saved_ns), (4, 2 * (3_000 + 8_000)));
    }

    #[test]
    fn counts_overlapping_occurrences_once() {
        // A A A A: `A A` occurs twice without overlap (score 2/4), `A A A` once.
        let all = advise(&trace("AAAA", 0), &AdviceOptions { threshold: 0.0, max_len: 3 });
        assert_eq!(names(&all), [("AA".to_string(), 2, 4)]);
    }

    #[test]
    fn keeps_a_shorter_chain_that_is_more_frequent_and_sorts_by_savings() {
        // X Y five times, X Y Z twice of them: X Y (5/5, 5 saved) is inside X Y Z (2/5, 4 saved)
        // but more frequent, so both are listed; Y Z (2/5) has X Y Z's figures and is not.
        let t = trace("XYZ|XYZ|XY|XY|XY", 0);
        let low = advise(&t, &AdviceOptions { threshold: 0.4, max_len: 8 });
        assert_eq!(names(&low), [("XY".to_string(), 5, 5), ("XYZ".to_string(), 2, 5)]);
        let short = advise(&t, &AdviceOptions { threshold: 0.4, max_len: 2 });
        assert_eq!(names(&short), [("XY".to_string(), 5, 5), ("YZ".to_string(), 2, 5)]);
    }
}
