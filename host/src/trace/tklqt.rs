//! TKLQT (total kernel launch and queuing time) and the CPU-/GPU-bound classification of a
//! batch-size sweep.

use super::record::Trace;

/// The launch-overhead figures of one trace, in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Launches in the trace.
    pub kernels: usize,
    /// Σ over launches of max(0, GPU start − CPU launch call): launch latency plus queuing.
    pub tklqt_ns: u64,
    /// Length of the union of the kernels' GPU intervals.
    pub gpu_busy_ns: u64,
    /// From the first GPU start to the last GPU end, minus [`Summary::gpu_busy_ns`].
    pub gpu_idle_ns: u64,
    /// Mean GPU duration of a kernel, rounded down.
    pub avg_kernel_ns: u64,
    /// From the first CPU launch call to the last GPU end.
    pub wall_ns: u64,
}

/// Which side limits a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// The GPU idles longer than it computes: it waits for the CPU's launches.
    Cpu,
    /// The GPU computes at least as long as it idles.
    Gpu,
}

impl Summary {
    /// The figures of `trace`; all zero for a trace without launches.
    pub fn of(trace: &Trace) -> Self {
        let mut intervals: Vec<(u64, u64)> = trace.launches().map(|l| (l.gpu_start_ns, l.gpu_end_ns)).collect();
        let (Some(first_call), Some(&(first_start, _))) =
            (trace.launches().map(|l| l.cpu_call_ns).min(), intervals.iter().min())
        else {
            return Self::default();
        };
        intervals.sort_unstable();
        let (mut busy, mut covered_to, mut last_end) = (0, first_start, first_start);
        for &(start, end) in &intervals {
            busy += end.saturating_sub(start.max(covered_to));
            covered_to = covered_to.max(end);
            last_end = last_end.max(end);
        }
        let kernels = intervals.len();
        let total: u64 = intervals.iter().map(|(start, end)| end - start).sum();
        Self {
            kernels,
            tklqt_ns: trace.launches().map(|l| l.gpu_start_ns.saturating_sub(l.cpu_call_ns)).sum(),
            gpu_busy_ns: busy,
            gpu_idle_ns: last_end - first_start - busy,
            avg_kernel_ns: total / kernels as u64,
            wall_ns: last_end.saturating_sub(first_call),
        }
    }

    /// Idle share of the GPU's span, in 0..=1 (0 for an empty span).
    pub fn idle_fraction(&self) -> f64 {
        let span = self.gpu_busy_ns + self.gpu_idle_ns;
        if span == 0 { 0.0 } else { self.gpu_idle_ns as f64 / span as f64 }
    }

    /// CPU-bound when the GPU is idle for more of its span than it is busy
    /// (`gpu_idle_ns > gpu_busy_ns`, an idle fraction above 0.5); GPU-bound otherwise.
    ///
    /// The rule needs one trace and no baseline: idle time between kernels is time the GPU
    /// waited for launches, so when it exceeds all kernel time together, launch overhead
    /// (which fusion or graphs remove) costs more than the kernels (which faster kernels
    /// shorten). TKLQT alone cannot decide it: launch latency makes it large per kernel even
    /// when nothing queues; it rises steeply only once the GPU is saturated and kernels queue.
    pub fn bound(&self) -> Bound {
        if self.gpu_idle_ns > self.gpu_busy_ns { Bound::Cpu } else { Bound::Gpu }
    }
}

/// Summaries of one workload over batch sizes, in increasing batch order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sweep(Vec<(u32, Summary)>);

impl Sweep {
    /// Orders `points` by batch size (stably, so equal batches keep their order).
    pub fn new(points: impl IntoIterator<Item = (u32, Summary)>) -> Self {
        let mut points: Vec<_> = points.into_iter().collect();
        points.sort_by_key(|&(batch, _)| batch);
        Self(points)
    }

    /// The (batch size, summary) points, by batch size.
    pub fn points(&self) -> &[(u32, Summary)] {
        &self.0
    }

    /// The first GPU-bound batch after a CPU-bound one; `None` when no batch is CPU-bound
    /// or none after it is GPU-bound.
    pub fn transition(&self) -> Option<u32> {
        let first_cpu = self.0.iter().position(|(_, s)| s.bound() == Bound::Cpu)?;
        self.0[first_cpu..].iter().find(|(_, s)| s.bound() == Bound::Gpu).map(|&(batch, _)| batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::record::{Event, LaunchRecord};

    /// A launch called at `call` µs that runs on the GPU from `start` to `end` µs.
    fn launch(call: u64, start: u64, end: u64) -> Event {
        Event::Launch(LaunchRecord {
            kernel: "k".into(),
            grid: [1; 3],
            block: [32, 1, 1],
            cluster: None,
            cpu_call_ns: call * 1000,
            cpu_return_ns: call * 1000 + 500,
            gpu_start_ns: start * 1000,
            gpu_end_ns: end * 1000,
        })
    }

    fn trace(events: Vec<Event>) -> Trace {
        Trace { label: "t".into(), batch: None, events }
    }

    #[test]
    fn sums_queuing_busy_and_idle_time_of_three_kernels() {
        // Calls at 0, 4, 8 µs; kernels at 3-5, 7-9, 11-13: each waits 3 µs and runs 2 µs.
        let s = Summary::of(&trace(vec![launch(0, 3, 5), launch(4, 7, 9), launch(8, 11, 13)]));
        assert_eq!(
            s,
            Summary { kernels: 3, tklqt_ns: 9_000, gpu_busy_ns: 6_000, gpu_idle_ns: 4_000, avg_kernel_ns: 2_000, wall_ns: 13_000 }
        );
        assert_eq!(s.bound(), Bound::Gpu, "idle 4 µs < busy 6 µs");
        assert!((s.idle_fraction() - 0.4).abs() < 1e-12);
    }

    #[test]
    fn merges_overlapping_kernels_and_clamps_clock_skew() {
        // The second kernel overlaps the first (1-6 ∪ 4-8 = 1-8); the third appears to start
        // 1 µs before its call, which adds nothing to TKLQT. Busy 7 + 3 µs, idle 12-8 = 4 µs,
        // mean duration (5 + 4 + 3) / 3 = 4 µs.
        let s = Summary::of(&trace(vec![launch(0, 1, 6), launch(2, 4, 8), launch(13, 12, 15)]));
        assert_eq!((s.tklqt_ns, s.gpu_busy_ns, s.gpu_idle_ns, s.avg_kernel_ns), (1_000 + 2_000, 10_000, 4_000, 4_000));
        assert_eq!(s.wall_ns, 15_000);
    }

    #[test]
    fn an_empty_trace_is_all_zero() {
        let s = Summary::of(&trace(vec![Event::Sync { cpu_ns: 5 }]));
        assert_eq!((s, s.idle_fraction()), (Summary::default(), 0.0));
    }

    #[test]
    fn classifies_by_idle_against_busy_time() {
        let starved = Summary::of(&trace(vec![launch(0, 3, 4), launch(4, 7, 8)])); // busy 2, idle 3
        let saturated = Summary::of(&trace(vec![launch(0, 3, 7), launch(1, 7, 11)])); // busy 8, idle 0
        assert_eq!((starved.bound(), saturated.bound()), (Bound::Cpu, Bound::Gpu));
    }

    #[test]
    fn finds_the_first_gpu_bound_batch_after_cpu_bound_ones() {
        let cpu = Summary { gpu_busy_ns: 1, gpu_idle_ns: 2, ..Summary::default() };
        let gpu = Summary { gpu_busy_ns: 2, gpu_idle_ns: 2, ..Summary::default() };
        let sweep = Sweep::new([(16, gpu), (1, gpu), (4, cpu), (2, cpu), (8, gpu)]);
        assert_eq!(sweep.points().iter().map(|p| p.0).collect::<Vec<_>>(), [1, 2, 4, 8, 16]);
        assert_eq!(sweep.transition(), Some(8), "batch 1 is GPU-bound but precedes the CPU-bound ones");
        assert_eq!(Sweep::new([(1, gpu), (2, gpu)]).transition(), None);
        assert_eq!(Sweep::new([(1, cpu), (2, cpu)]).transition(), None);
    }
}
