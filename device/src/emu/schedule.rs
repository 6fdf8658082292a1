//! The scheduler: clusters one after another on the launching OS thread (a co-resident
//! launch's all at once); every thread a fiber, run in turn until each waits at a barrier or
//! sleeps, then the barriers that everyone reached are released and the sleepers run again.
//! When no barrier can be released and every sleeper reads what it read before, the launch
//! is deadlocked.

use super::fiber::{Fiber, Resume, Step};
use super::memory::BlockMemory;
use super::ops::{Matrix, Shuffle, Spin};
use super::thread::{Epochs, Registers, Thread};
use super::{Fault, Launch};
use crate::limits::WARP_SIZE;
use crate::Dim3;
use core::cell::{Cell, RefCell};
use core::ptr;
use corosensei::stack::DefaultStack;
use std::boxed::Box;
use std::string::String;
use std::rc::Rc;
use std::sync::Mutex;
use std::vec::Vec;
use std::format;

/// Where a suspended thread waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// `bar.sync`.
    Block,
    /// `bar.warp.sync` with this member mask.
    Warp(u32),
    /// A shuffle or vote with this member mask (its operands are in the warp's slots).
    Collective(Shuffle, u32),
    /// A tensor-core collective of the whole warp (its operands are in the warp's slots).
    Matrix(Matrix),
    /// `barrier.cluster.wait` for this phase.
    Cluster(u32),
    /// `mbarrier.try_wait.parity` on mbarrier (index, parity).
    Mbarrier(u32, u32),
    /// `wgmma.wait_group`: every thread of the warpgroup.
    Warpgroup,
    /// `nanosleep`: runnable again next round.
    Sleep,
}

impl Wait {
    fn describe(self) -> String {
        match self {
            Wait::Block => String::from("bar.sync"),
            Wait::Warp(mask) => format!("bar.warp.sync {mask:#010x}"),
            Wait::Collective(op, mask) => format!("{op:?} shuffle/vote with mask {mask:#010x}"),
            Wait::Matrix(op) => format!("{op:?} (all 32 lanes)"),
            Wait::Cluster(_) => String::from("barrier.cluster.wait"),
            Wait::Mbarrier(..) => String::from("mbarrier.try_wait"),
            Wait::Warpgroup => String::from("wgmma.wait_group (all 128 threads of the warpgroup)"),
            Wait::Sleep => String::from("nanosleep"),
        }
    }
}

/// The static shared arrays of a launch: each call site's offset, the same in every block.
pub struct Registry {
    sites: RefCell<Vec<(usize, u32)>>,
    end: Cell<usize>,
    limit: u32,
}

impl Registry {
    /// The offset of `site`'s array of `bytes`, placing it on first use.
    pub fn place(&self, site: usize, bytes: usize) -> Result<u32, String> {
        let mut sites = self.sites.borrow_mut();
        if let Some(&(_, offset)) = sites.iter().find(|(s, _)| *s == site) {
            return Ok(offset);
        }
        let offset = self.end.get().next_multiple_of(16);
        let end = offset + bytes;
        if end > self.limit as usize {
            return Err(format!(
                "static shared arrays need {end} bytes, over the {} bytes left next to the dynamic shared memory",
                self.limit
            ));
        }
        sites.push((site, offset as u32));
        self.end.set(end);
        Ok(offset as u32)
    }

    /// Bytes of static arrays placed so far.
    pub fn static_bytes(&self) -> u32 {
        self.end.get() as u32
    }
}

/// One warp's exchange slots and barrier count.
#[derive(Default)]
pub struct Warp {
    pub epoch: u32,
    pub operands: [(u32, u32); 32],
    pub results: [u32; 32],
    /// Each lane's registers for a [`Matrix`] collective, and what it gets back.
    pub matrix_operands: [[u32; 10]; 32],
    pub matrix_results: [[u32; 4]; 32],
}

/// One block of a cluster.
pub struct Block {
    pub ctaid: Dim3,
    pub memory: RefCell<BlockMemory>,
    pub epoch: Cell<u32>,
    pub warps: Vec<RefCell<Warp>>,
    pub running: Cell<u32>,
    /// The latest access by another block, as (its cluster epoch, its thread id): the block
    /// must not exit before a cluster barrier orders that access.
    pub remote_access: Cell<Option<(u32, u32)>>,
    /// Asynchronous writes by other blocks (`st.async`, bulk copies), as (the mbarrier they
    /// complete on, its phase, the writer's thread id), the latest phase per mbarrier: the
    /// block must not exit before each phase has completed.
    pub async_writes: RefCell<Vec<(u32, u32, u32)>>,
}

impl Block {
    /// Records an asynchronous write by thread `writer` that completes on phase `phase` of
    /// mbarrier `index`.
    pub fn record_async_write(&self, index: u32, phase: u32, writer: u32) {
        let mut writes = self.async_writes.borrow_mut();
        match writes.iter_mut().find(|w| w.0 == index) {
            Some(latest) if latest.1 <= phase => *latest = (index, phase, writer),
            Some(_) => {}
            None => writes.push((index, phase, writer)),
        }
    }

    /// True once every thread of the block has returned.
    pub fn exited(&self) -> bool {
        self.running.get() == 0
    }
}

/// Arrivals at the cluster barrier's current phase.
#[derive(Default, Clone, Copy)]
pub struct ClusterBarrier {
    pub phase: u32,
    pub arrived: u32,
}

/// One cluster being emulated: what every thread of it shares.
pub struct Cluster {
    pub kernel: &'static str,
    /// `%clusterid`.
    pub id: Dim3,
    pub size: u32,
    pub threads_per_block: u32,
    pub block_dim: Dim3,
    pub buffers: Rc<[(u64, usize, &'static str)]>,
    pub registry: Rc<Registry>,
    pub blocks: Vec<Block>,
    pub barrier: Cell<ClusterBarrier>,
    pub mbarriers: RefCell<Vec<super::mbarrier::Mbarrier>>,
}

impl Cluster {
    /// (block index in the grid, thread index in the block) of thread `id`.
    pub fn locate(&self, id: u32) -> (Dim3, Dim3) {
        let block = &self.blocks[(id / self.threads_per_block) as usize];
        (block.ctaid, unflatten(id % self.threads_per_block, self.block_dim))
    }
}

/// Runs `body` as every thread of `launch`'s grid on the calling OS thread, one cluster after
/// another, or all at once when the launch is co-resident: kernels read and write global
/// memory with plain loads and stores, so clusters running on several OS threads at once
/// could race in the Rust sense when a kernel races in the CUDA sense.
///
/// # Errors
/// The first [`Fault`]: a race, a deadlock, a bad access, a panic.
pub fn run(launch: &Launch<'_>, body: &(dyn Fn() + Sync)) -> Result<(), Fault> {
    let clusters = Dim3::new(launch.grid.x / launch.cluster.x, launch.grid.y / launch.cluster.y, launch.grid.z / launch.cluster.z);
    let registry = Rc::new(Registry {
        sites: RefCell::default(),
        end: Cell::new(0),
        limit: launch.smem_limit.saturating_sub(launch.dynamic_smem_bytes),
    });
    let buffers: Rc<[(u64, usize, &'static str)]> = launch.buffers.into();
    let count = clusters.volume() as u32;
    let together = if launch.co_resident { count } else { 1 };
    let mut stacks = take_stacks();
    let outcome = (0..count).step_by(together as usize).try_for_each(|first| {
        let ids = (first..(first + together).min(count)).map(|index| unflatten(index, clusters));
        run_clusters(launch, &registry, &buffers, ids, clusters, body, &mut stacks)
    });
    return_stacks(stacks);
    outcome
}

/// Fiber stacks kept between launches: mapping and first-touching them costs more than
/// running small kernels.
static STACKS: Mutex<Vec<Vec<DefaultStack>>> = Mutex::new(Vec::new());

/// Most stacks kept per pool (each reserves 128 KB of address space).
const KEPT_STACKS: usize = 4096;

fn take_stacks() -> Vec<DefaultStack> {
    STACKS.lock().unwrap_or_else(|e| e.into_inner()).pop().unwrap_or_default()
}

fn return_stacks(mut stacks: Vec<DefaultStack>) {
    stacks.truncate(KEPT_STACKS);
    STACKS.lock().unwrap_or_else(|e| e.into_inner()).push(stacks);
}

fn unflatten(i: u32, dim: Dim3) -> Dim3 {
    Dim3::new(i % dim.x, i / dim.x % dim.y, i / (dim.x * dim.y))
}

fn run_clusters(
    launch: &Launch<'_>,
    registry: &Rc<Registry>,
    buffers: &Rc<[(u64, usize, &'static str)]>,
    clusterids: impl Iterator<Item = Dim3>,
    nclusterid: Dim3,
    body: &(dyn Fn() + Sync),
    stacks: &mut Vec<DefaultStack>,
) -> Result<(), Fault> {
    let clusters: Vec<Box<Cluster>> = clusterids.map(|clusterid| new_cluster(launch, registry, buffers, clusterid)).collect();
    let mut fibers = Vec::with_capacity(clusters.iter().map(|c| (c.size * c.threads_per_block) as usize).sum());
    for (cluster, clusterid) in clusters.iter().map(|c| (c, c.id)) {
        for rank in 0..cluster.size {
            let block = &cluster.blocks[rank as usize];
            for index in 0..cluster.threads_per_block {
                let thread = Box::new(Thread {
                    registers: Registers {
                        tid: unflatten(index, launch.block),
                        ntid: launch.block,
                        ctaid: block.ctaid,
                        nctaid: launch.grid,
                        lane: index % WARP_SIZE,
                        dynamic_smem_size: launch.dynamic_smem_bytes,
                        cluster_rank: rank,
                        cluster_ctaid: unflatten(rank, launch.cluster),
                        cluster_nctaid: launch.cluster,
                        clusterid,
                        nclusterid,
                    },
                    rank,
                    index,
                    id: rank * cluster.threads_per_block + index,
                    epochs: Cell::new(Epochs::default()),
                    cluster_arrival: Cell::new(None),
                    mbarrier_phases: RefCell::default(),
                    arrivals: Cell::new(0),
                    known_arrivals: RefCell::default(),
                    spin: Cell::new(None),
                    cluster: &**cluster,
                    yielder: Cell::new(ptr::null()),
                });
                // SAFETY: the clusters and `body` outlive every fiber: all are run to
                // completion (aborted ones too) below, before this function returns.
                fibers.push(unsafe { Fiber::new(thread, body, stacks.pop()) });
            }
        }
    }
    let outcome = schedule(&clusters, &mut fibers);
    if outcome.is_err() {
        for fiber in fibers.iter_mut().filter(|f| !f.done()) {
            let _ = fiber.resume(Resume::Abort);
        }
    }
    // A fiber that did not finish even when aborted is dropped with its stack.
    stacks.extend(fibers.into_iter().filter(Fiber::done).map(Fiber::into_stack));
    outcome
}

fn new_cluster(launch: &Launch<'_>, registry: &Rc<Registry>, buffers: &Rc<[(u64, usize, &'static str)]>, clusterid: Dim3) -> Box<Cluster> {
    let (cdim, bdim) = (launch.cluster, launch.block);
    let size = cdim.volume() as u32;
    let threads_per_block = bdim.volume() as u32;
    let blocks = (0..size)
        .map(|rank| {
            let c = unflatten(rank, cdim);
            Block {
                ctaid: Dim3::new(clusterid.x * cdim.x + c.x, clusterid.y * cdim.y + c.y, clusterid.z * cdim.z + c.z),
                memory: RefCell::new(BlockMemory::new(launch.dynamic_smem_bytes)),
                epoch: Cell::new(0),
                warps: (0..threads_per_block.div_ceil(WARP_SIZE)).map(|_| RefCell::default()).collect(),
                running: Cell::new(threads_per_block),
                remote_access: Cell::new(None),
                async_writes: RefCell::new(Vec::new()),
            }
        })
        .collect();
    Box::new(Cluster {
        kernel: launch.kernel,
        id: clusterid,
        size,
        threads_per_block,
        block_dim: bdim,
        buffers: buffers.clone(),
        registry: registry.clone(),
        blocks,
        barrier: Cell::default(),
        mbarriers: RefCell::default(),
    })
}

/// Runs the clusters' fibers (cluster after cluster, each's threads in order) to completion,
/// releasing barriers as they fill and resuming sleepers each round.
fn schedule(clusters: &[Box<Cluster>], fibers: &mut [Fiber]) -> Result<(), Fault> {
    let mut waits: Vec<Option<Wait>> = std::vec![None; fibers.len()];
    let mut runnable: Vec<bool> = std::vec![true; fibers.len()];
    // What each sleeper read before its last sleep: the same again is no progress.
    let mut spins: Vec<Option<Spin>> = std::vec![None; fibers.len()];
    loop {
        let mut progress = false;
        for (i, fiber) in fibers.iter_mut().enumerate() {
            if !runnable[i] {
                continue;
            }
            match fiber.resume(Resume::Go) {
                Step::Wait(Wait::Sleep) => {
                    let read = fiber.thread().spin.get();
                    progress |= read.is_none() || read != spins[i];
                    spins[i] = read;
                    waits[i] = Some(Wait::Sleep);
                    runnable[i] = false;
                }
                Step::Wait(wait) => {
                    progress = true;
                    waits[i] = Some(wait);
                    runnable[i] = false;
                }
                Step::Done(result) => {
                    progress = true;
                    runnable[i] = false;
                    let thread = fiber.thread();
                    let cluster = thread.cluster();
                    if let Err(message) = result {
                        let registers = &thread.registers;
                        return Err(Fault { kernel: cluster.kernel, at: Some((registers.ctaid, registers.tid)), message });
                    }
                    let block = &cluster.blocks[thread.rank as usize];
                    block.running.set(block.running.get() - 1);
                    if block.exited() {
                        check_exit(cluster, thread)?;
                    }
                }
            }
        }
        if fibers.iter().all(Fiber::done) {
            return Ok(());
        }
        let mut first = 0;
        for cluster in clusters {
            let range = first..first + (cluster.size * cluster.threads_per_block) as usize;
            progress |= release(cluster, &fibers[range.clone()], &mut waits[range.clone()], &mut runnable[range.clone()])?;
            first = range.end;
        }
        if !progress {
            return Err(Fault { kernel: clusters[0].kernel, at: None, message: deadlock(clusters, fibers, &waits) });
        }
        for (wait, runnable) in waits.iter_mut().zip(runnable.iter_mut()) {
            if *wait == Some(Wait::Sleep) {
                (*wait, *runnable) = (None, true);
            }
        }
    }
}

/// A block exits once its last thread returns: any peer access to its shared memory must
/// have been ordered before that by a cluster barrier the block passed, and any asynchronous
/// write into it must have completed its mbarrier's phase.
fn check_exit(cluster: &Cluster, last: &Thread) -> Result<(), Fault> {
    let block = &cluster.blocks[last.rank as usize];
    let fault = |accessor: u32, what: &str, fix: &str| {
        Err(Fault {
            kernel: cluster.kernel,
            at: Some(cluster.locate(accessor)),
            message: format!("{what} the shared memory of block {} (cluster rank {}), which {fix}", block.ctaid, last.rank),
        })
    };
    if let Some((_, accessor)) = block.remote_access.get().filter(|&(epoch, _)| epoch >= last.epochs.get().cluster) {
        return fault(accessor, "read or wrote", "has exited with no cluster barrier after the access: end the kernel with cluster::sync() so peers stay resident");
    }
    let barriers = cluster.mbarriers.borrow();
    match block.async_writes.borrow().iter().find(|&&(index, phase, _)| barriers[index as usize].completed <= phase) {
        Some(&(_, _, writer)) => fault(
            writer,
            "stored or copied asynchronously into",
            "exited before the mbarrier phase counting those bytes completed: wait for the phase (`Mailbox::wait`, `Mbarrier::wait`) before the block ends",
        ),
        None => Ok(()),
    }
}

/// Releases every barrier whose participants have all arrived; false when none could be.
fn release(cluster: &Cluster, fibers: &[Fiber], waits: &mut [Option<Wait>], runnable: &mut [bool]) -> Result<bool, Fault> {
    let mut released = false;
    let per_block = cluster.threads_per_block as usize;
    for (rank, block) in cluster.blocks.iter().enumerate() {
        let range = rank * per_block..(rank + 1) * per_block;
        // bar.sync: every thread of the block, none exited.
        if waits[range.clone()].iter().all(|w| *w == Some(Wait::Block)) {
            block.epoch.set(block.epoch.get() + 1);
            for i in range.clone() {
                let thread = fibers[i].thread();
                thread.epochs.set(Epochs { block: block.epoch.get(), ..thread.epochs.get() });
                waits[i] = None;
                runnable[i] = true;
            }
            released = true;
        }
        // wgmma.wait_group: every thread of a warpgroup; each learns what the others know.
        if per_block.is_multiple_of(128) {
            for group in range.clone().step_by(128) {
                let members = group..group + 128;
                if waits[members.clone()].iter().all(|w| *w == Some(Wait::Warpgroup)) {
                    let threads: Vec<&Thread> = members.clone().map(|i| fibers[i].thread()).collect();
                    super::mbarrier::share_knowledge(&threads);
                    for i in members {
                        waits[i] = None;
                        runnable[i] = true;
                    }
                    released = true;
                }
            }
        }
        // Warp rendezvous: every lane of the member mask waits at the same one.
        for (w, warp) in block.warps.iter().enumerate() {
            let first = range.start + w * WARP_SIZE as usize;
            let lanes = (range.end - first).min(WARP_SIZE as usize);
            for lane in 0..lanes {
                let wait = match waits[first + lane] {
                    Some(wait @ (Wait::Warp(_) | Wait::Collective(..) | Wait::Matrix(_))) => wait,
                    _ => continue,
                };
                let mask = match wait {
                    Wait::Warp(mask) | Wait::Collective(_, mask) => mask,
                    _ => u32::MAX,
                };
                let members = (0..lanes).filter(|l| mask & (1 << l) != 0);
                if !members.clone().all(|l| waits[first + l] == Some(wait)) {
                    continue;
                }
                let mut warp = warp.borrow_mut();
                match wait {
                    Wait::Collective(op, _) => {
                        let operands = warp.operands;
                        for l in members.clone() {
                            warp.results[l] = op.apply(&operands, l as u32, mask).map_err(|message| {
                                let registers = &fibers[first + l].thread().registers;
                                Fault { kernel: cluster.kernel, at: Some((registers.ctaid, registers.tid)), message }
                            })?;
                        }
                    }
                    Wait::Matrix(op) => warp.matrix_results = op.apply(&warp.matrix_operands),
                    _ => warp.epoch += 1,
                }
                for l in members {
                    let thread = fibers[first + l].thread();
                    if let Wait::Warp(_) = wait {
                        thread.epochs.set(Epochs { warp: warp.epoch, ..thread.epochs.get() });
                    }
                    waits[first + l] = None;
                    runnable[first + l] = true;
                }
                released = true;
            }
        }
    }
    // barrier.cluster.wait: released once its phase completed (counted at arrival);
    // mbarrier waits once the phase of their parity has.
    let phase = cluster.barrier.get().phase;
    for (i, wait) in waits.iter_mut().enumerate() {
        let done = match *wait {
            Some(Wait::Cluster(waited)) => waited < phase,
            Some(Wait::Mbarrier(barrier, parity)) => cluster.mbarriers.borrow()[barrier as usize].completed & 1 != parity,
            _ => false,
        };
        if done {
            if let Some(Wait::Cluster(_)) = *wait {
                let thread = fibers[i].thread();
                thread.epochs.set(Epochs { cluster: phase, ..thread.epochs.get() });
            }
            *wait = None;
            runnable[i] = true;
            released = true;
        }
    }
    Ok(released)
}

/// Who waits where, per block, for a deadlock report.
fn deadlock(clusters: &[Box<Cluster>], fibers: &[Fiber], waits: &[Option<Wait>]) -> String {
    let spinning = waits.contains(&Some(Wait::Sleep));
    let mut report = String::from(if spinning {
        "deadlock: threads spin on global memory that no running thread will change, or wait at barriers that the others never reach"
    } else {
        "deadlock: threads wait at barriers that the others never reach"
    });
    let mut first = 0;
    for cluster in clusters {
        let per_block = cluster.threads_per_block as usize;
        for block in &cluster.blocks {
            let range = first..first + per_block;
            first = range.end;
            let mut groups: Vec<(String, u32, Dim3)> = Vec::new();
            for i in range {
                let thread = fibers[i].thread();
                let what = match waits[i] {
                    Some(Wait::Sleep) => spin(cluster, thread.spin.get()),
                    Some(wait) => format!("wait at {}", wait.describe()),
                    None if fibers[i].done() => String::from("exited"),
                    None => continue,
                };
                match groups.iter_mut().find(|(w, ..)| *w == what) {
                    Some(group) => group.1 += 1,
                    None => groups.push((what, 1, thread.registers.tid)),
                }
            }
            if groups.iter().any(|(w, ..)| w != "exited") {
                report += &format!("; block {}:", block.ctaid);
                for (what, count, first) in groups {
                    report += &format!(" {count} thread(s) {what} (first: thread {first})");
                }
            }
        }
    }
    report
}

/// What a sleeping thread spins on: the words it last read with `ld.acquire`, by buffer.
fn spin(cluster: &Cluster, spin: Option<Spin>) -> String {
    let Some(Spin { address, words, read }) = spin else { return String::from("sleep (nanosleep) without reading a global word") };
    let read = &read[..words as usize];
    let buffer = cluster.buffers.iter().find(|&&(start, bytes, _)| address >= start && address < start + bytes as u64);
    let (what, value) = match buffer {
        Some(&(start, _, name)) => {
            let first = (address - start) / 4;
            let words = if read.len() == 1 { format!("word {first}") } else { format!("words {first}..{}", first + read.len() as u64) };
            (format!("{words} of `{name}`"), read)
        }
        None => (format!("the words at {address:#x}"), read),
    };
    let value = if value.len() == 1 { format!("{}", value[0]) } else { format!("{value:?}") };
    format!("spin on {what}, which read {value} and no running thread changes")
}
