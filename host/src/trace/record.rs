//! The recorded data: launches and synchronisations on one clock, and their JSON-lines files.
//!
//! A file is one header line, `{"label":"bert b=1","batch":1}`, then one event per line:
//! `{"event":"launch","kernel":"softmax","grid":[96,1,1],"block":[128,1,1],"cpu_call_ns":..,
//! "cpu_return_ns":..,"gpu_start_ns":..,"gpu_end_ns":..}` (`"cluster":[2,1,1]` when launched
//! as a cluster) or `{"event":"sync","cpu_ns":..}`.

use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// One kernel launch. Times are nanoseconds since the trace's origin, CPU and GPU on one clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchRecord {
    /// The kernel's PTX entry name.
    pub kernel: String,
    /// Blocks in the grid.
    pub grid: [u32; 3],
    /// Threads in a block.
    pub block: [u32; 3],
    /// Blocks per cluster, for cluster launches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<[u32; 3]>,
    /// When the CPU launch call began.
    pub cpu_call_ns: u64,
    /// When the CPU launch call returned.
    pub cpu_return_ns: u64,
    /// When the kernel began on the GPU.
    pub gpu_start_ns: u64,
    /// When the kernel ended on the GPU.
    pub gpu_end_ns: u64,
}

/// What a trace records, in CPU order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A kernel launch.
    Launch(LaunchRecord),
    /// A stream or device synchronisation: the CPU waited for the GPU, up to `cpu_ns`.
    Sync { cpu_ns: u64 },
}

/// A recording of one run: a label, the batch size where there is one, and its events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace {
    /// What was run (a workload's name).
    pub label: String,
    /// Its batch size, for sweeps.
    pub batch: Option<u32>,
    /// Launches and synchronisations, in CPU order.
    pub events: Vec<Event>,
}

/// A trace file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot {action} trace `{}`: {source}", path.display())]
    Io { action: &'static str, path: PathBuf, source: io::Error },
    /// A line is not JSON of the expected shape, or its times are out of order.
    #[error("trace `{}`, line {line}: {reason}", path.display())]
    Format { path: PathBuf, line: usize, reason: String },
}

#[derive(Serialize, Deserialize)]
struct Header {
    label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    batch: Option<u32>,
}

impl Event {
    /// The launch, if this is one.
    pub fn as_launch(&self) -> Option<&LaunchRecord> {
        match self {
            Event::Launch(launch) => Some(launch),
            Event::Sync { .. } => None,
        }
    }
}

impl Trace {
    /// The launches, in CPU order.
    pub fn launches(&self) -> impl Iterator<Item = &LaunchRecord> {
        self.events.iter().filter_map(Event::as_launch)
    }

    /// The trace as JSON lines: the header, then one event per line.
    pub fn to_jsonl(&self) -> String {
        let header = Header { label: self.label.clone(), batch: self.batch };
        let lines = std::iter::once(serde_json::to_string(&header))
            .chain(self.events.iter().map(serde_json::to_string))
            .map(|line| line.expect("traces are plain data and always serialise") + "\n");
        lines.collect()
    }

    /// Writes [`Trace::to_jsonl`] to `path`.
    ///
    /// # Errors
    /// [`TraceError::Io`] when the file cannot be written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), TraceError> {
        let path = path.as_ref();
        fs::write(path, self.to_jsonl()).map_err(|source| TraceError::Io { action: "write", path: path.into(), source })
    }

    /// Reads a trace written by [`Trace::save`] (blank lines are skipped).
    ///
    /// # Errors
    /// [`TraceError::Io`] when the file cannot be read; [`TraceError::Format`] for the first
    /// line that is not a header or an event, or a launch that ends before it starts.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, TraceError> {
        let path = path.as_ref();
        let text = fs::read_to_string(path).map_err(|source| TraceError::Io { action: "read", path: path.into(), source })?;
        parse(&text).map_err(|(line, reason)| TraceError::Format { path: path.into(), line, reason })
    }
}

/// Parses JSON lines; an error is the 1-based line and why.
fn parse(text: &str) -> Result<Trace, (usize, String)> {
    let mut lines = text.lines().enumerate().map(|(i, line)| (i + 1, line)).filter(|(_, line)| !line.trim().is_empty());
    let (line, first) = lines.next().ok_or((1, "empty file; expected a header line".to_string()))?;
    let header: Header = serde_json::from_str(first).map_err(|err| (line, format!("bad header: {err}")))?;
    let events = lines
        .map(|(line, text)| {
            let event: Event = serde_json::from_str(text).map_err(|err| (line, err.to_string()))?;
            check(&event).map_err(|reason| (line, reason))?;
            Ok(event)
        })
        .collect::<Result<_, _>>()?;
    Ok(Trace { label: header.label, batch: header.batch, events })
}

fn check(event: &Event) -> Result<(), String> {
    let Event::Launch(l) = event else { return Ok(()) };
    if l.cpu_return_ns < l.cpu_call_ns {
        return Err(format!("`{}` returns at {} ns, before its call at {} ns", l.kernel, l.cpu_return_ns, l.cpu_call_ns));
    }
    if l.gpu_end_ns < l.gpu_start_ns {
        return Err(format!("`{}` ends at {} ns, before it starts at {} ns", l.kernel, l.gpu_end_ns, l.gpu_start_ns));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(kernel: &str, cluster: Option<[u32; 3]>) -> Event {
        Event::Launch(LaunchRecord {
            kernel: kernel.into(),
            grid: [4, 2, 1],
            block: [128, 1, 1],
            cluster,
            cpu_call_ns: 100,
            cpu_return_ns: 2_600,
            gpu_start_ns: 4_000,
            gpu_end_ns: 6_500,
        })
    }

    /// A trace file in the temp dir, removed when dropped.
    struct TempFile(PathBuf);

    impl AsRef<Path> for TempFile {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = fs::remove_file(&self.0);
        }
    }

    fn temp(name: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("clusterfuse-record-{}-{name}.jsonl", std::process::id()));
        fs::write(&path, text).unwrap();
        TempFile(path)
    }

    #[test]
    fn writes_one_line_per_event_and_reads_it_back() {
        let trace = Trace {
            label: "t".into(),
            batch: Some(8),
            events: vec![launch("a", None), Event::Sync { cpu_ns: 7_000 }, launch("b", Some([2, 1, 1]))],
        };
        let text = trace.to_jsonl();
        assert_eq!(text.lines().next(), Some(r#"{"label":"t","batch":8}"#));
        assert_eq!(text.lines().nth(2), Some(r#"{"event":"sync","cpu_ns":7000}"#));
        assert!(!text.lines().nth(1).unwrap().contains("cluster"), "no cluster key without a cluster");
        let path = temp("roundtrip", "");
        trace.save(&path).unwrap();
        assert_eq!(Trace::load(&path).unwrap(), trace);
        assert_eq!(trace.launches().map(|l| l.kernel.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn reports_the_line_of_a_bad_event() {
        let path = temp("bad-json", "{\"label\":\"t\"}\n\n{\"event\":\"sync\",\"cpu_ns\":1}\n{\"event\":\"launch\"}\n");
        let err = Trace::load(&path).unwrap_err();
        assert!(matches!(err, TraceError::Format { line: 4, .. }), "{err}");
        assert!(err.to_string().contains("missing field `kernel`"), "{err}");
    }

    #[test]
    fn rejects_a_kernel_that_ends_before_it_starts() {
        let mut bad = launch("a", None);
        if let Event::Launch(l) = &mut bad {
            l.gpu_end_ns = l.gpu_start_ns - 1;
        }
        let trace = Trace { label: "t".into(), batch: None, events: vec![bad] };
        let err = Trace::load(temp("backwards", &trace.to_jsonl())).unwrap_err();
        assert!(matches!(err, TraceError::Format { line: 2, .. }), "{err}");
        assert!(err.to_string().contains("`a` ends at 3999 ns, before it starts at 4000 ns"), "{err}");
    }

    #[test]
    fn names_the_missing_file_and_rejects_an_empty_one() {
        let missing = Trace::load("/nonexistent/trace.jsonl").unwrap_err();
        assert!(matches!(missing, TraceError::Io { action: "read", .. }), "{missing}");
        let empty = Trace::load(temp("empty", "\n")).unwrap_err();
        assert!(matches!(empty, TraceError::Format { line: 1, .. }), "{empty}");
    }
}
