//! CUDA graphs of clusterfuse launches: capture a sequence of launches (cluster launches
//! included) once, replay it for one `cuGraphLaunch`, update its parameters in place.
//!
//! [`Gpu::capture`] runs a closure on a fresh capture stream (`cuStreamBeginCapture`,
//! thread-local mode: the legacy default stream cannot be captured) and instantiates what it
//! launched. [`Graph::update`] captures the launches again with new arguments and applies
//! them with `cuGraphExecUpdate`, without instantiating again; the driver accepts new
//! arguments and grids, and refuses with [`CaptureError::UpdateRefused`] a different graph
//! (another number of launches, say). On the CPU emulator, which runs each launch as it is
//! made, there is nothing to capture: [`Gpu::capture`] fails with [`CaptureError::Emulator`].
//!
//! ```no_run
//! # use clusterfuse_host::{Gpu, Result};
//! # fn main() -> Result<()> {
//! let gpu = Gpu::new(0)?;
//! let launches = |a: f32| move |stream: &clusterfuse_host::Stream| -> Result<()> {
//!     // … typed launches on `stream` (not on `gpu.stream()`), with `a` among their arguments …
//!     # let _ = (stream, a);
//!     Ok(())
//! };
//! let mut graph = gpu.capture(launches(2.0))?;
//! // SAFETY: every buffer the captured launches use is still alive.
//! unsafe { graph.replay(gpu.stream())? };
//! graph.update(launches(3.0))?; // the next replays use a = 3
//! # Ok(()) }
//! ```

use crate::error::{CaptureError, DriverContext, Error, GraphChange, Result};
use crate::gpu::{Gpu, Stream};
use cudarc::driver::result;
use cudarc::driver::sys::{self, CUgraphExecUpdateResult as UpdateResult, CUstreamCaptureMode};
use cudarc::driver::CudaContext;
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    /// Captures in progress on this thread.
    static CAPTURING: Cell<u32> = const { Cell::new(0) };
}

/// Fails with [`CaptureError::Synchronize`] when this thread is capturing a graph.
pub(crate) fn forbid_in_capture(call: &'static str) -> Result<()> {
    match CAPTURING.get() {
        0 => Ok(()),
        _ => Err(CaptureError::Synchronize { call }.into()),
    }
}

/// An instantiated CUDA graph (`CUgraphExec`) of captured launches.
pub struct Graph {
    exec: sys::CUgraphExec,
    nodes: usize,
    context: Arc<CudaContext>,
}

// SAFETY: an executable graph may be used from any thread; `Graph` is not `Sync`, and its
// methods that change it take `&mut self`, so calls on it are never concurrent.
unsafe impl Send for Graph {}

impl Gpu {
    /// Captures the launches `launches` makes on the stream it is given into a graph, without
    /// running them. Kernel parameters are copied at capture; buffers are referenced by address.
    ///
    /// # Errors
    /// [`CaptureError::Emulator`] on the emulator (the closure is not run);
    /// [`CaptureError::Synchronize`] for a [`Gpu::synchronize`] or [`Gpu::download`] inside
    /// the closure; [`CaptureError::Invalidated`] when the driver ended the capture; the
    /// closure's own error; driver errors.
    pub fn capture(&self, launches: impl FnOnce(&Stream) -> Result<()>) -> Result<Graph> {
        let context = self.context().ok_or(CaptureError::Emulator)?;
        let captured = Captured::new(context, launches)?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `captured.graph` is a live graph.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, captured.graph, 0) }.result().driver("cuGraphInstantiate", None)?;
        Ok(Graph { exec, nodes: captured.nodes()?, context: context.clone() })
    }
}

impl Graph {
    /// Kernel launches (nodes) in the graph.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Enqueues one replay of every captured launch on `stream` (`cuGraphLaunch`).
    ///
    /// # Safety
    /// 1. Every buffer passed to the launches of the last capture or [`Graph::update`] stays
    ///    alive, with the length it had then, until the replay has completed on `stream`: the
    ///    graph holds their addresses, not borrows.
    /// 2. `stream` orders the replay after those buffers' uploads and before their frees: it
    ///    is the stream they were made on (their [`Gpu`]'s), or one synchronised with it.
    /// 3. The captured kernels' modules are still loaded: their [`Kernel`](crate::Kernel)s,
    ///    or the [`Gpu`] that loaded them, are alive.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] for an emulator stream or one of another GPU; driver errors.
    pub unsafe fn replay(&self, stream: &Stream) -> Result<()> {
        let stream = stream.cuda().ok_or(Error::WrongBackend)?;
        if !Arc::ptr_eq(&self.context, stream.context()) {
            return Err(Error::WrongBackend);
        }
        stream.context().bind_to_thread().driver("cuCtxSetCurrent", None)?;
        sys::cuGraphLaunch(self.exec, stream.cu_stream()).result().driver("cuGraphLaunch", None)
    }

    /// Captures `launches` (as many as the graph's, in the same order, with new arguments)
    /// and updates the graph's parameters in place (`cuGraphExecUpdate`).
    ///
    /// # Errors
    /// [`CaptureError::UpdateRefused`], saying what changed, when the driver cannot apply
    /// the launches to this graph: capture a new one. Otherwise as for [`Gpu::capture`].
    pub fn update(&mut self, launches: impl FnOnce(&Stream) -> Result<()>) -> Result<()> {
        let captured = Captured::new(&self.context, launches)?;
        let nodes = captured.nodes()?;
        // SAFETY: all-zero is a valid result record (success, no nodes) for the driver to fill.
        let mut info: sys::CUgraphExecUpdateResultInfo = unsafe { std::mem::zeroed() };
        // SAFETY: both graphs are live; `info` outlives the call.
        match unsafe { sys::cuGraphExecUpdate_v2(self.exec, captured.graph, &mut info) } {
            sys::CUresult::CUDA_SUCCESS => {
                self.nodes = nodes;
                Ok(())
            }
            sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE => Err(CaptureError::UpdateRefused(change(info.result)).into()),
            status => status.result().driver("cuGraphExecUpdate", None),
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: `exec` is live and owned; an error is kept for the context's next check.
        self.context.record_err(unsafe { result::graph::exec_destroy(self.exec) });
    }
}

/// Counts this thread's capture in [`CAPTURING`] while alive (a panic included).
struct Capturing;

impl Capturing {
    fn enter() -> Self {
        CAPTURING.set(CAPTURING.get() + 1);
        Self
    }
}

impl Drop for Capturing {
    fn drop(&mut self) {
        CAPTURING.set(CAPTURING.get() - 1);
    }
}

/// A captured graph, not instantiated; destroyed on drop.
struct Captured<'c> {
    graph: sys::CUgraph,
    context: &'c CudaContext,
}

impl<'c> Captured<'c> {
    /// Runs `launches` on a new stream in capture mode and ends the capture, whatever the
    /// closure returned.
    fn new(context: &'c Arc<CudaContext>, launches: impl FnOnce(&Stream) -> Result<()>) -> Result<Self> {
        let cuda = context.new_stream().driver("cuStreamCreate", None)?;
        cuda.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).driver("cuStreamBeginCapture", None)?;
        let stream = Stream { cuda: Some(cuda.clone()), recorder: None };
        let launched = {
            let _capturing = Capturing::enter();
            launches(&stream)
        };
        // SAFETY: the stream is live and capturing.
        let ended = unsafe { result::stream::end_capture(cuda.cu_stream()) };
        let captured = ended.map(|graph| Self { graph, context });
        launched?;
        captured.map_err(|err| CaptureError::Invalidated(err).into())
    }

    /// Nodes in the graph.
    fn nodes(&self) -> Result<usize> {
        let mut count = 0;
        // SAFETY: the graph is live; a null node array asks only for the count.
        unsafe { sys::cuGraphGetNodes(self.graph, std::ptr::null_mut(), &mut count) }.result().driver("cuGraphGetNodes", None)?;
        Ok(count)
    }
}

impl Drop for Captured<'_> {
    fn drop(&mut self) {
        // SAFETY: the graph is live and owned; instantiation or update copied what they need.
        self.context.record_err(unsafe { result::graph::destroy(self.graph) });
    }
}

/// What a refused `cuGraphExecUpdate` reports, as a [`GraphChange`].
fn change(result: UpdateResult) -> GraphChange {
    match result {
        UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED => GraphChange::Topology,
        UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED => GraphChange::NodeType,
        UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED
        | UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE => GraphChange::Function,
        UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED => GraphChange::Parameters,
        UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED => GraphChange::Attributes,
        UpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS
        | UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR
        | UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED => GraphChange::Unsupported,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_emulator_refuses_to_capture_without_running_the_closure() {
        let gpu = Gpu::emulator();
        let mut ran = false;
        let err = gpu
            .capture(|_| {
                ran = true;
                Ok(())
            })
            .err();
        assert!(matches!(err, Some(Error::Capture(CaptureError::Emulator))), "{err:?}");
        assert!(!ran);
        assert!(err.unwrap().to_string().contains("CUDA graphs need a GPU"));
    }

    #[test]
    fn waiting_for_the_gpu_inside_a_capture_is_refused_and_allowed_after() {
        let gpu = Gpu::emulator();
        let buffer = gpu.upload(&[1u32]).unwrap();
        let capturing = Capturing::enter();
        let (sync, download) = (gpu.synchronize(), gpu.download(&buffer));
        drop(capturing);
        assert!(matches!(sync, Err(Error::Capture(CaptureError::Synchronize { call: "Gpu::synchronize" }))), "{sync:?}");
        assert!(matches!(download, Err(Error::Capture(CaptureError::Synchronize { call: "Gpu::download" }))), "{download:?}");
        assert_eq!(gpu.download(&buffer).unwrap(), [1]);
    }

    #[test]
    fn names_what_a_refused_update_changed() {
        assert_eq!(change(UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED), GraphChange::Topology);
        assert_eq!(change(UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE), GraphChange::Function);
        assert_eq!(change(UpdateResult::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED), GraphChange::Parameters);
        let err = Error::from(CaptureError::UpdateRefused(GraphChange::Topology));
        assert_eq!(
            err.to_string(),
            "cannot update the graph in place: the number of launches or their dependencies changed; capture a new graph instead"
        );
    }
}
