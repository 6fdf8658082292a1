//! The CPU emulator: runs kernels on the host with GPU semantics, so that tests without a GPU
//! check what kernels compute. [`crate::arch`] calls into it off the GPU; the host runtime
//! starts launches with [`run`].
//!
//! **What it models.** Every thread of the grid runs as a fiber; the threads of one cluster
//! (a block is a cluster of one) run interleaved at synchronisation points, and clusters one
//! after another (a persistent kernel's all at once, interleaved: its blocks wait on each
//! other's global writes, and a `nanosleep` yields), all on the launching OS thread (so a
//! kernel's races on global memory stay wrong answers, not undefined behaviour in the host
//! process). `bar.sync`, `bar.warp.sync`, the cluster barrier (split
//! arrive/wait), shuffles, votes and the tensor-core collectives (`mma.sync`, `ldmatrix`,
//! computed from every lane's fragment registers per PTX's layouts) are real rendezvous of
//! the threads they name; mbarriers count arrivals and transaction bytes per phase, and bulk
//! copies (`cp.async.bulk`) and TMA tile loads (`cp.async.bulk.tensor.2d`, zero-filled out of
//! bounds, 128-byte swizzle) complete on them. `wgmma.mma_async` reads its K-major,
//! 128-byte-swizzled operands through their matrix descriptors ([`tensor`]); a thread's
//! mbarrier arrival orders its earlier shared-memory accesses before the threads that wait for
//! that phase. Shared memory is per block, starts filled with
//! `0xff` bytes (NaN as floats), and is reached through distributed-shared addresses from
//! `mapa` for peer blocks.
//!
//! **What it reports**, as a [`Fault`] naming the kernel, block and thread:
//! - a data race on shared memory: two threads touch the same byte, at least one writing,
//!   with no barrier both passed in between (like `compute-sanitizer --tool racecheck`), or a
//!   thread touches a bulk copy's destination before waiting for its mbarrier phase;
//! - a distributed-shared access before any cluster barrier (the peer may not have started);
//! - a deadlock: threads wait at a barrier that the others never reach (they exited or wait
//!   elsewhere), or spin on a global word (`ld.acquire` then `nanosleep`, as
//!   [`grid::Published`](crate::grid::Published) waits) that no running thread will change,
//!   with who waits where and, for a spin, the buffer, the word and the value it reads;
//! - out-of-bounds or misaligned shared accesses, accesses to a peer block that has exited,
//!   global accesses outside every buffer passed to the kernel, and `trap`/panics (bounds
//!   checks of inputs and outputs).
//!
//! **Where the race check is lenient** (it may miss a race, never invents one): it keeps a
//! byte's last two readers only; a `bar.warp.sync` with a partial mask orders the whole warp;
//! a cluster barrier is taken to order bulk copies issued before it (true once their
//! receivers waited before it, which it does not check); the source of a bulk copy may be
//! overwritten once the issuing block has passed a barrier; and the async-proxy fence a bulk
//! copy's source needs (`cluster::fence_async_copies`) is not checked.
//!
//! **What it does not model.** Timing (`clock64` reads wall time), memory-ordering subtleties
//! beyond barriers (execution is sequentially consistent and fences are no-ops), races on
//! global memory, warps that diverge inside a shuffle, copies in flight (`cp.async` completes at issue, so a missing
//! `cp.async.wait_group` goes unseen), the tensor cores' internal rounding (`mma.sync` sums
//! in f64 and rounds once, to f32; so does `wgmma`, which also runs at issue, so that
//! `wgmma.wait_group` and `wgmma.fence` order nothing and a warpgroup that diverges around a
//! `wgmma` goes unseen), and floating-point approximations of the `.approx`
//! instructions (the emulator computes them exactly).

mod fiber;
mod mbarrier;
pub mod memory;
mod ops;
mod schedule;
pub mod tensor;
mod thread;

pub use mbarrier::{
    arrive as mbarrier_arrive, arrive_expect_tx as mbarrier_arrive_expect_tx, bulk_copy, bulk_load, init as mbarrier_init, store_async, try_wait as mbarrier_try_wait,
};
pub use ops::*;
pub use schedule::run;
pub use thread::Registers;

use crate::Dim3;
use std::fmt;
use std::string::String;

/// One launch, as the host planned it.
#[derive(Clone, Debug)]
pub struct Launch<'a> {
    /// The kernel's name, for reports.
    pub kernel: &'static str,
    /// Grid extent in blocks.
    pub grid: Dim3,
    /// Block extent in threads.
    pub block: Dim3,
    /// Cluster extent in blocks (`1, 1, 1` for launches without clusters).
    pub cluster: Dim3,
    /// Dynamic shared memory per block.
    pub dynamic_smem_bytes: u32,
    /// Shared memory a block may use, static and dynamic together.
    pub smem_limit: u32,
    /// The device buffers passed to the kernel, as `(address, bytes, parameter name)`: global
    /// accesses must fall inside one of them.
    pub buffers: &'a [(u64, usize, &'static str)],
    /// Every block of the grid resident at once, as a persistent kernel's launch guarantees
    /// on a GPU: the clusters run interleaved, so that blocks may wait for each other's
    /// global writes. Otherwise clusters run one after another.
    pub co_resident: bool,
}

/// Why an emulated launch failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The kernel.
    pub kernel: &'static str,
    /// The block and thread that faulted, where one did (a deadlock names no single thread).
    pub at: Option<(Dim3, Dim3)>,
    /// What went wrong.
    pub message: String,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kernel `{}`", self.kernel)?;
        if let Some((block, thread)) = self.at {
            write!(f, ", block {block}, thread {thread}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Fault {}
