//! The launch recorder, the live half of [`trace`](crate::trace): an opt-in mode of a
//! [`Gpu`] that logs every launch and synchronisation into a [`Trace`].
//!
//! Each launch through [`Kernel::launch_raw`](crate::Kernel::launch_raw) (every typed launch
//! goes through it) is logged with its kernel, grid, block and cluster, the CPU time at the
//! launch call and at its return, and its GPU start and end: two CUDA events recorded on the
//! launch's stream just before and just after it. Each [`Gpu::synchronize`] and
//! [`Gpu::download`] is logged as an [`Event::Sync`]. All times are nanoseconds on one clock
//! whose origin is the start of the recording: CPU times from [`Instant`], GPU times from
//! `cuEventElapsedTime` against an origin event recorded on the idle device at the start, as
//! the CPU clock read when that record call returned. Event timestamps resolve about 0.5 µs;
//! on an idle GPU a kernel's start event fires as soon as it is submitted, just before the
//! launch call begins, so an idle GPU shows a start at about the launch call.
//!
//! Not recording costs one relaxed atomic load per launch. Recording costs two
//! `cuEventRecord`s and a lock per launch; the events are pooled across recordings, so the
//! first recording on a device also creates them (record a warm-up run first). On the CPU
//! emulator, which runs each launch during the call, GPU start and end are the call's own
//! times. Launches captured into a graph are not run, so not logged, and a graph replay is
//! not a launch.
//!
//! ```
//! # fn main() -> clusterfuse_host::Result<()> {
//! use clusterfuse_host::{Gpu, Recording};
//! let gpu = Gpu::emulator();
//! let recording = Recording::start(&gpu)?;
//! gpu.synchronize()?; // … launches …
//! let trace = recording.finish("demo", Some(1))?;
//! assert_eq!(trace.events.len(), 1);
//! # Ok(()) }
//! ```

use crate::config::LaunchPlan;
use crate::error::{DriverContext, Error, Result};
use crate::gpu::{Gpu, Stream};
use crate::trace::{Event, LaunchRecord, Trace};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// A recording in progress on one device; [`Recording::finish`] returns its [`Trace`].
/// Dropped unfinished, it stops and discards what it logged. One at a time per device.
pub struct Recording<'g> {
    gpu: &'g Gpu,
}

impl<'g> Recording<'g> {
    /// Starts logging `gpu`'s launches. On a GPU, first waits for the default stream, so
    /// that the origin event is recorded on an idle device.
    ///
    /// # Errors
    /// [`Error::AlreadyRecording`] while another recording runs on `gpu`; driver errors.
    pub fn start(gpu: &'g Gpu) -> Result<Self> {
        gpu.recorder().start(gpu.stream())?;
        Ok(Self { gpu })
    }

    /// Stops logging and returns the trace, labelled: waits for the logged launches' end
    /// events and puts every GPU time on the recording's clock.
    ///
    /// # Errors
    /// Driver errors, including faults of the logged launches.
    pub fn finish(self, label: impl Into<String>, batch: Option<u32>) -> Result<Trace> {
        let recorder = self.gpu.recorder();
        let events = match recorder.stop() {
            Some(log) => recorder.resolve(log)?,
            // Unreachable: this recording started the log and only it stops the log.
            None => Vec::new(),
        };
        Ok(Trace { label: label.into(), batch, events })
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        let recorder = self.gpu.recorder();
        if let Some(log) = recorder.stop() {
            recorder.recycle(log.into_events());
        }
    }
}

impl Gpu {
    /// Runs `workload` under a [`Recording`] and returns its value with the trace.
    ///
    /// # Errors
    /// As for [`Recording::start`] and [`Recording::finish`], and `workload`'s own.
    pub fn record<T, E: From<Error>>(
        &self,
        label: impl Into<String>,
        batch: Option<u32>,
        workload: impl FnOnce() -> Result<T, E>,
    ) -> Result<(T, Trace), E> {
        let recording = Recording::start(self)?;
        let value = workload()?;
        Ok((value, recording.finish(label, batch)?))
    }
}

impl Stream {
    /// The device's recorder while it records launches on this stream.
    #[inline(always)]
    pub(crate) fn recording(&self) -> Option<&Recorder> {
        self.recorder.as_deref().filter(|recorder| recorder.active.load(Ordering::Relaxed))
    }
}

/// A device's recorder: what launches and synchronisations consult. Idle until started.
#[derive(Default)]
pub(crate) struct Recorder {
    /// Whether a log is open: the only thing an unrecorded launch reads.
    active: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    log: Option<Log>,
    /// Timing events kept for the next launches and recordings.
    spare: Vec<CudaEvent>,
}

/// What a recording has logged so far.
struct Log {
    origin: Instant,
    /// Recorded at `origin` (None on the emulator).
    origin_event: Option<CudaEvent>,
    entries: Vec<Entry<CudaEvent>>,
}

impl Log {
    /// Its timing events, to be reused.
    fn into_events(self) -> impl Iterator<Item = CudaEvent> {
        self.entries.into_iter().flat_map(Entry::into_events).chain(self.origin_event)
    }
}

/// A logged launch or synchronisation; `E` stands for a GPU timestamp not yet read.
enum Entry<E> {
    Launch { kernel: &'static str, plan: LaunchPlan, cpu_call_ns: u64, cpu_return_ns: u64, gpu: Option<(E, E)> },
    Sync { cpu_ns: u64 },
}

impl Recorder {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn start(&self, stream: &Stream) -> Result<()> {
        let mut state = self.state();
        if state.log.is_some() {
            return Err(Error::AlreadyRecording);
        }
        let origin_event = match stream.cuda() {
            Some(cuda) => {
                cuda.synchronize().driver("cuStreamSynchronize", None)?;
                let event = take_event(&mut state.spare, cuda)?;
                event.record(cuda).driver("cuEventRecord", None)?;
                Some(event)
            }
            None => None,
        };
        state.log = Some(Log { origin: Instant::now(), origin_event, entries: Vec::new() });
        self.active.store(true, Ordering::Relaxed);
        Ok(())
    }

    fn stop(&self) -> Option<Log> {
        self.active.store(false, Ordering::Relaxed);
        self.state().log.take()
    }

    fn recycle(&self, events: impl IntoIterator<Item = CudaEvent>) {
        self.state().spare.extend(events);
    }

    /// The log's events with GPU times on its clock; the timing events go back to the pool.
    fn resolve(&self, log: Log) -> Result<Vec<Event>> {
        let events = match &log.origin_event {
            Some(origin) => resolve(&log.entries, |event| origin.elapsed_ms(event).driver("cuEventElapsedTime", None)),
            None => resolve(&log.entries, |_| Err(Error::WrongBackend)),
        };
        self.recycle(log.into_events());
        events
    }

    /// Runs `launch`, which submits one kernel to `stream`, between two timing events, and
    /// logs it (unless it failed, or the recording stopped meanwhile).
    pub(crate) fn launch(&self, kernel: &'static str, plan: &LaunchPlan, stream: &Stream, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut state = self.state();
        let State { log, spare } = &mut *state;
        let Some(log) = log else { return launch() };
        let gpu = match stream.cuda() {
            Some(cuda) => {
                let (start, end) = (take_event(spare, cuda)?, take_event(spare, cuda)?);
                start.record(cuda).driver("cuEventRecord", Some(kernel))?;
                Some((start, end, cuda))
            }
            None => None,
        };
        let cpu_call_ns = log.now_ns();
        let launched = launch();
        let cpu_return_ns = log.now_ns();
        let gpu = match (launched, gpu) {
            (Err(err), gpu) => {
                spare.extend(gpu.into_iter().flat_map(|(start, end, _)| [start, end]));
                return Err(err);
            }
            (Ok(()), Some((start, end, cuda))) => {
                end.record(cuda).driver("cuEventRecord", Some(kernel))?;
                Some((start, end))
            }
            (Ok(()), None) => None,
        };
        log.entries.push(Entry::Launch { kernel, plan: *plan, cpu_call_ns, cpu_return_ns, gpu });
        Ok(())
    }

    /// Logs a synchronisation that has just returned.
    pub(crate) fn synchronized(&self) {
        if self.active.load(Ordering::Relaxed) {
            if let Some(log) = &mut self.state().log {
                let cpu_ns = log.now_ns();
                log.entries.push(Entry::Sync { cpu_ns });
            }
        }
    }
}

impl Log {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }
}

impl<E> Entry<E> {
    fn into_events(self) -> impl Iterator<Item = E> {
        let gpu = match self {
            Entry::Launch { gpu, .. } => gpu,
            Entry::Sync { .. } => None,
        };
        gpu.into_iter().flat_map(|(start, end)| [start, end])
    }
}

fn take_event(spare: &mut Vec<CudaEvent>, stream: &CudaStream) -> Result<CudaEvent> {
    match spare.pop() {
        Some(event) => Ok(event),
        None => stream.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).driver("cuEventCreate", None),
    }
}

/// The trace events of `entries`, each GPU timestamp read as milliseconds after the origin
/// event by `elapsed_ms`; a launch without events ran during its call (the emulator).
fn resolve<E>(entries: &[Entry<E>], mut elapsed_ms: impl FnMut(&E) -> Result<f32>) -> Result<Vec<Event>> {
    let mut events = Vec::with_capacity(entries.len());
    for entry in entries {
        events.push(match entry {
            Entry::Sync { cpu_ns } => Event::Sync { cpu_ns: *cpu_ns },
            Entry::Launch { kernel, plan, cpu_call_ns, cpu_return_ns, gpu } => {
                let (gpu_start_ns, gpu_end_ns) = match gpu {
                    Some((start, end)) => (origin_ns(elapsed_ms(start)?), origin_ns(elapsed_ms(end)?)),
                    None => (*cpu_call_ns, *cpu_return_ns),
                };
                Event::Launch(LaunchRecord {
                    kernel: (*kernel).into(),
                    grid: plan.grid.to_array(),
                    block: plan.block.to_array(),
                    cluster: plan.cluster.map(|cluster| cluster.to_array()),
                    cpu_call_ns: *cpu_call_ns,
                    cpu_return_ns: *cpu_return_ns,
                    gpu_start_ns,
                    // Both ends are rounded separately; keep the order the GPU guarantees.
                    gpu_end_ns: gpu_end_ns.max(gpu_start_ns),
                })
            }
        });
    }
    Ok(events)
}

/// A GPU timestamp `elapsed_ms` after the origin event, in nanoseconds on the recording's
/// clock, where the origin event stands at 0 (times before it clamp to 0).
fn origin_ns(elapsed_ms: f32) -> u64 {
    (f64::from(elapsed_ms) * 1e6).round().max(0.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{Kernel, KernelFacts};
    use crate::LaunchConfig;
    use clusterfuse_device::Dim3;

    fn plan(cluster: Option<Dim3>) -> LaunchPlan {
        LaunchPlan { grid: Dim3::new(8, 2, 1), block: Dim3::new(128, 1, 1), cluster, dynamic_smem_bytes: 0, programmatic: false, max_shared_carveout: false }
    }

    #[test]
    fn aligns_event_times_with_the_origin_in_nanoseconds() {
        assert_eq!(origin_ns(0.0), 0);
        assert_eq!(origin_ns(0.0015), 1_500);
        assert_eq!(origin_ns(12.345_678), 12_345_678);
        assert_eq!(origin_ns(-0.002), 0, "an event before the origin clamps to it");
    }

    #[test]
    fn resolves_injected_event_times_into_trace_events() {
        let entries = vec![
            Entry::Launch { kernel: "a", plan: plan(None), cpu_call_ns: 100, cpu_return_ns: 2_600, gpu: Some((0.004f32, 0.0065f32)) },
            Entry::Sync { cpu_ns: 9_000 },
            Entry::Launch { kernel: "b", plan: plan(Some(Dim3::new(2, 1, 1))), cpu_call_ns: 9_500, cpu_return_ns: 11_000, gpu: Some((0.012, 0.0119)) },
        ];
        let events = resolve(&entries, |ms| Ok(*ms)).unwrap();
        let launches: Vec<&LaunchRecord> = events.iter().filter_map(Event::as_launch).collect();
        assert_eq!(events[1], Event::Sync { cpu_ns: 9_000 });
        let a = launches[0];
        assert_eq!((a.kernel.as_str(), a.grid, a.block, a.cluster), ("a", [8, 2, 1], [128, 1, 1], None));
        assert_eq!((a.cpu_call_ns, a.cpu_return_ns, a.gpu_start_ns, a.gpu_end_ns), (100, 2_600, 4_000, 6_500));
        let b = launches[1];
        assert_eq!(b.cluster, Some([2, 1, 1]));
        assert_eq!((b.gpu_start_ns, b.gpu_end_ns), (12_000, 12_000), "an end rounded before its start is kept at it");
    }

    #[test]
    fn emulated_launches_run_during_their_call_and_a_failed_read_fails_the_trace() {
        let entries: Vec<Entry<f32>> =
            vec![Entry::Launch { kernel: "k", plan: plan(None), cpu_call_ns: 5, cpu_return_ns: 70, gpu: None }];
        let events = resolve(&entries, |_| Err(Error::WrongBackend)).unwrap();
        let launch = events[0].as_launch().unwrap();
        assert_eq!((launch.gpu_start_ns, launch.gpu_end_ns), (5, 70));
        let timed = vec![Entry::Launch { kernel: "k", plan: plan(None), cpu_call_ns: 5, cpu_return_ns: 70, gpu: Some((1.0f32, 2.0)) }];
        assert!(matches!(resolve(&timed, |_| Err(Error::WrongBackend)), Err(Error::WrongBackend)));
    }

    static FACTS: KernelFacts = KernelFacts { name: "nothing", max_threads: None, min_blocks: None, cluster: None, persistent: false };

    /// Launches a do-nothing emulated kernel of 2 blocks.
    fn launch(gpu: &Gpu, kernel: &Kernel) -> Result<()> {
        let plan = kernel.plan(&LaunchConfig { grid: 2.into(), block: 32.into(), ..LaunchConfig::default() })?;
        // SAFETY: the kernel takes no parameters and touches no memory.
        unsafe { kernel.launch_lowered(gpu.stream(), &plan, &mut [], &[], &|| ()) }
    }

    #[test]
    fn records_each_launch_and_sync_in_order_on_one_clock() {
        let gpu = Gpu::emulator();
        let kernel = Kernel::emulated(&FACTS, gpu.smem_limit());
        launch(&gpu, &kernel).unwrap();
        let ((), trace) = gpu
            .record("emu", Some(4), || {
                launch(&gpu, &kernel)?;
                launch(&gpu, &kernel)?;
                gpu.synchronize()?;
                launch(&gpu, &kernel)
            })
            .unwrap();
        assert_eq!((trace.label.as_str(), trace.batch), ("emu", Some(4)));
        let kinds: Vec<&str> = trace.events.iter().map(|e| if e.as_launch().is_some() { "launch" } else { "sync" }).collect();
        assert_eq!(kinds, ["launch", "launch", "sync", "launch"], "the launch before the recording is not in it");
        let mut last = 0;
        for event in &trace.events {
            let (first, end) = match event {
                Event::Launch(l) => {
                    assert_eq!((l.kernel.as_str(), l.grid, l.block), ("nothing", [2, 1, 1], [32, 1, 1]));
                    assert!(l.gpu_start_ns <= l.gpu_end_ns);
                    (l.cpu_call_ns, l.cpu_return_ns)
                }
                Event::Sync { cpu_ns } => (*cpu_ns, *cpu_ns),
            };
            assert!(last <= first && first <= end, "CPU times go forward: {last} {first} {end}");
            last = end;
        }
        launch(&gpu, &kernel).unwrap();
        let trace = Recording::start(&gpu).unwrap().finish("again", None).unwrap();
        assert!(trace.events.is_empty(), "a finished recording logs nothing more");
    }

    #[test]
    fn one_recording_at_a_time_and_a_dropped_one_discards_its_log() {
        let gpu = Gpu::emulator();
        let kernel = Kernel::emulated(&FACTS, gpu.smem_limit());
        let first = Recording::start(&gpu).unwrap();
        assert!(matches!(Recording::start(&gpu), Err(Error::AlreadyRecording)));
        launch(&gpu, &kernel).unwrap();
        drop(first);
        let second = Recording::start(&gpu).unwrap();
        launch(&gpu, &kernel).unwrap();
        assert_eq!(second.finish("second", None).unwrap().launches().count(), 1);
    }

    #[test]
    fn a_failed_launch_is_not_logged() {
        let gpu = Gpu::emulator();
        let kernel = Kernel::emulated(&FACTS, gpu.smem_limit());
        let plan = kernel.plan(&LaunchConfig::default()).unwrap();
        let (result, trace) = gpu
            .record("panics", None, || {
                // SAFETY: as in `launch`; the kernel panics on every thread.
                Ok::<_, Error>(unsafe { kernel.launch_lowered(gpu.stream(), &plan, &mut [], &[], &|| panic!("boom")) })
            })
            .unwrap();
        assert!(matches!(result, Err(Error::Emulator(_))), "{result:?}");
        assert!(trace.events.is_empty());
    }
}
