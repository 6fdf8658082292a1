//! The analysis half of the launch-overhead toolkit: recorded launches in, TKLQT, the
//! CPU-/GPU-bound transition over batch sizes, and fusion advice out. Pure host code, no GPU.
//!
//! ```
//! use clusterfuse_host::trace::{advise, AdviceOptions, Bound, Event, LaunchRecord, Summary, Trace};
//!
//! // Two kernels launched 4 µs apart that each run 1 µs: the GPU waits on the CPU.
//! let launch = |kernel: &str, call: u64| Event::Launch(LaunchRecord {
//!     kernel: kernel.into(), grid: [1; 3], block: [256, 1, 1], cluster: None,
//!     cpu_call_ns: call, cpu_return_ns: call + 3_000, gpu_start_ns: call + 2_000, gpu_end_ns: call + 3_000,
//! });
//! let trace = Trace {
//!     label: "demo".into(),
//!     batch: Some(1),
//!     events: vec![launch("norm", 0), launch("gemm", 4_000), Event::Sync { cpu_ns: 8_000 },
//!                  launch("norm", 9_000), launch("gemm", 13_000)],
//! };
//! let summary = Summary::of(&trace);
//! assert_eq!((summary.tklqt_ns, summary.gpu_busy_ns), (4 * 2_000, 4 * 1_000));
//! assert_eq!(summary.bound(), Bound::Cpu);
//! let advice = advise(&trace, &AdviceOptions::default());
//! assert_eq!(advice[0].kernels, ["norm", "gemm"]); // every norm is followed by a gemm
//! assert_eq!((advice[0].launches_saved(), advice[0].idle_saved_ns), (2, 2 * 3_000));
//! ```

mod proximity;
mod record;
mod report;
mod svg;
mod tklqt;

pub use proximity::{advise, AdviceOptions, Chain};
pub use record::{Event, LaunchRecord, Trace, TraceError};
pub use report::{advice_table, summary_table, sweep_plots, sweep_report, sweep_table};
pub use svg::{Plot, Series};
pub use tklqt::{Bound, Summary, Sweep};
