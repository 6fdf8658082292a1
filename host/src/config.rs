//! Launch configurations and the checks every launch passes before it reaches the driver.
//! Pure functions of the kernel's facts and the configuration: testable without a GPU.

use crate::kernel::KernelFacts;
use clusterfuse_device::limits::{
    MAX_BLOCKS_PER_SM, MAX_BLOCK_DIM, MAX_CLUSTER_SIZE, MAX_GRID_DIM, MAX_PORTABLE_CLUSTER_SIZE,
    MAX_SHARED_MEMORY_PER_SM, MAX_THREADS_PER_BLOCK, RESERVED_SHARED_MEMORY_PER_BLOCK,
};
use clusterfuse_device::Dim3;

/// How to launch a kernel.
///
/// ```
/// # use clusterfuse_host::{LaunchConfig, Dim3};
/// let config = LaunchConfig { grid: 128.into(), block: 256.into(), dynamic_smem_bytes: 64 * 1024, ..LaunchConfig::default() };
/// assert_eq!(config.cluster, None);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads in a block.
    pub block: Dim3,
    /// Blocks in a cluster; `None` takes the kernel's declared `cluster(..)`, if any.
    pub cluster: Option<Dim3>,
    /// Dynamic shared memory per block, in bytes. Above 48 KB the kernel is opted in
    /// automatically.
    pub dynamic_smem_bytes: u32,
    /// Programmatic dependent launch: the kernel may start before the previous kernel on its
    /// stream has finished, once every block of that kernel has called
    /// `grid::launch_dependents` (or exited); it must call `grid::wait_for_prerequisites`
    /// before it touches anything the previous kernel writes. Sets
    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`, also inside graph capture
    /// (the edge becomes a programmatic one). The emulator runs launches one after another.
    pub programmatic: bool,
    /// At most this many of the kernel's blocks resident on one SM at once (`None`: as many
    /// as fit): the plan raises the dynamic shared memory until no more fit, and asks for the
    /// SM's whole shared memory (the carveout), which the count assumes. For
    /// latency-bound kernels of about one block per SM, launched programmatically: their
    /// blocks that start early otherwise crowd onto the few SMs the previous kernel leaves
    /// free, and run there side by side for the whole kernel.
    pub max_blocks_per_sm: Option<u32>,
}

impl Default for LaunchConfig {
    /// One block of one thread, no cluster, no dynamic shared memory, ordinary stream order,
    /// no cap on blocks per SM.
    fn default() -> Self {
        Self { grid: Dim3::default(), block: Dim3::default(), cluster: None, dynamic_smem_bytes: 0, programmatic: false, max_blocks_per_sm: None }
    }
}

/// A configuration that passed every check, ready for the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchPlan {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads in a block.
    pub block: Dim3,
    /// The effective cluster (declared or requested), if any.
    pub cluster: Option<Dim3>,
    /// Dynamic shared memory per block: the configuration's, or more where
    /// [`LaunchConfig::max_blocks_per_sm`] pads it.
    pub dynamic_smem_bytes: u32,
    /// Programmatic dependent launch (see [`LaunchConfig::programmatic`]).
    pub programmatic: bool,
    /// The SM's L1 / shared memory split set to all the shared memory it can have: the
    /// shared memory of [`LaunchConfig::max_blocks_per_sm`] counts on it, and kernels of
    /// one split can share an SM that kernels of different splits cannot.
    pub max_shared_carveout: bool,
}

impl LaunchPlan {
    /// True when the cluster is larger than the portable 8 and needs the opt-in.
    pub fn non_portable_cluster(&self) -> bool {
        self.cluster.is_some_and(|c| c.volume() > MAX_PORTABLE_CLUSTER_SIZE as u64)
    }
}

/// Why a launch configuration was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    #[error("{what} {dim:?} has a zero extent; every extent is at least 1")]
    ZeroExtent { what: &'static str, dim: Dim3 },
    #[error("block {block:?} has {threads} threads, more than {MAX_THREADS_PER_BLOCK}")]
    BlockTooLarge { block: Dim3, threads: u64 },
    #[error("block {block:?} exceeds the per-dimension maximum {MAX_BLOCK_DIM:?}")]
    BlockDimTooLarge { block: Dim3 },
    #[error("grid {grid:?} exceeds the per-dimension maximum {MAX_GRID_DIM:?}")]
    GridDimTooLarge { grid: Dim3 },
    #[error("block of {threads} threads exceeds the kernel's launch bound `max_threads = {max_threads}`; use a smaller block or raise the bound")]
    ExceedsLaunchBounds { threads: u64, max_threads: u32 },
    #[error("cluster {cluster:?} has {size} blocks, more than Hopper's maximum of {MAX_CLUSTER_SIZE}")]
    ClusterTooLarge { cluster: Dim3, size: u64 },
    #[error("cluster {cluster:?} does not divide grid {grid:?}; make every grid extent a multiple of the cluster's")]
    ClusterDoesNotDivideGrid { grid: Dim3, cluster: Dim3 },
    #[error("the kernel declares `cluster{declared:?}` but the launch asks for {requested:?}; leave `cluster: None` or match it")]
    ClusterMismatch { declared: Dim3, requested: Dim3 },
    #[error("{static_bytes} B static + {dynamic_bytes} B dynamic shared memory exceeds the {limit} B a block may use")]
    SharedMemoryTooLarge { static_bytes: u32, dynamic_bytes: u32, limit: u32 },
    #[error("`max_blocks_per_sm: Some({blocks})`: an SM holds 1 to {MAX_BLOCKS_PER_SM} blocks; ask for that many, or `None`")]
    BlocksPerSmOutOfRange { blocks: u32 },
}

/// Checks `config` for a kernel with `facts` that uses `static_smem` bytes of static shared
/// memory on a device allowing `smem_limit` bytes per block.
pub fn plan(facts: &KernelFacts, static_smem: u32, smem_limit: u32, config: &LaunchConfig) -> Result<LaunchPlan, LaunchError> {
    let LaunchConfig { grid, block, dynamic_smem_bytes, programmatic, max_blocks_per_sm, .. } = *config;
    for (what, dim) in [("grid", grid), ("block", block)] {
        if dim.to_array().contains(&0) {
            return Err(LaunchError::ZeroExtent { what, dim });
        }
    }
    if block.to_array().iter().zip(MAX_BLOCK_DIM).any(|(&d, max)| d > max) {
        return Err(LaunchError::BlockDimTooLarge { block });
    }
    let threads = block.volume();
    if threads > MAX_THREADS_PER_BLOCK as u64 {
        return Err(LaunchError::BlockTooLarge { block, threads });
    }
    if let Some(max_threads) = facts.max_threads {
        if threads > max_threads as u64 {
            return Err(LaunchError::ExceedsLaunchBounds { threads, max_threads });
        }
    }
    if grid.to_array().iter().zip(MAX_GRID_DIM).any(|(&d, max)| d > max) {
        return Err(LaunchError::GridDimTooLarge { grid });
    }
    let cluster = match (facts.cluster, config.cluster) {
        (Some(declared), Some(requested)) if declared != requested => {
            return Err(LaunchError::ClusterMismatch { declared, requested });
        }
        (declared, requested) => requested.or(declared),
    };
    if let Some(cluster) = cluster {
        if cluster.to_array().contains(&0) {
            return Err(LaunchError::ZeroExtent { what: "cluster", dim: cluster });
        }
        let size = cluster.volume();
        if size > MAX_CLUSTER_SIZE as u64 {
            return Err(LaunchError::ClusterTooLarge { cluster, size });
        }
        if grid.to_array().iter().zip(cluster.to_array()).any(|(&g, c)| g % c != 0) {
            return Err(LaunchError::ClusterDoesNotDivideGrid { grid, cluster });
        }
    }
    let dynamic_smem_bytes = match max_blocks_per_sm {
        Some(blocks) if !(1..=MAX_BLOCKS_PER_SM).contains(&blocks) => return Err(LaunchError::BlocksPerSmOutOfRange { blocks }),
        Some(blocks) => dynamic_smem_bytes.max(smem_for_at_most(blocks).saturating_sub(static_smem)),
        None => dynamic_smem_bytes,
    };
    if static_smem as u64 + dynamic_smem_bytes as u64 > smem_limit as u64 {
        return Err(LaunchError::SharedMemoryTooLarge { static_bytes: static_smem, dynamic_bytes: dynamic_smem_bytes, limit: smem_limit });
    }
    Ok(LaunchPlan { grid, block, cluster, dynamic_smem_bytes, programmatic, max_shared_carveout: max_blocks_per_sm.is_some() })
}

/// The least shared memory a block declares (static and dynamic) such that at most `blocks`
/// of them fit on an SM: `blocks + 1` of them, each with the system's reserve, overflow it.
fn smem_for_at_most(blocks: u32) -> u32 {
    (MAX_SHARED_MEMORY_PER_SM / (blocks + 1) + 1).saturating_sub(RESERVED_SHARED_MEMORY_PER_BLOCK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clusterfuse_device::limits::MAX_SHARED_MEMORY_PER_BLOCK;

    const PLAIN: KernelFacts = KernelFacts { name: "k", max_threads: None, min_blocks: None, cluster: None, persistent: false };
    const BOUNDED: KernelFacts = KernelFacts { name: "k", max_threads: Some(256), min_blocks: Some(2), cluster: None, persistent: false };
    const CLUSTER4: KernelFacts = KernelFacts { name: "k", max_threads: None, min_blocks: None, cluster: Some(Dim3::new(4, 1, 1)), persistent: false };

    fn config(grid: u32, block: u32) -> LaunchConfig {
        LaunchConfig { grid: grid.into(), block: block.into(), ..LaunchConfig::default() }
    }

    fn check(facts: &KernelFacts, config: LaunchConfig) -> Result<LaunchPlan, LaunchError> {
        plan(facts, 0, MAX_SHARED_MEMORY_PER_BLOCK, &config)
    }

    #[test]
    fn accepts_a_plain_launch() {
        let plan = check(&PLAIN, config(1000, 256)).unwrap();
        assert_eq!(plan.cluster, None);
        assert_eq!(plan.dynamic_smem_bytes, 0);
    }

    #[test]
    fn rejects_zero_extents() {
        assert!(matches!(check(&PLAIN, config(0, 256)), Err(LaunchError::ZeroExtent { what: "grid", .. })));
        assert!(matches!(check(&PLAIN, config(4, 0)), Err(LaunchError::ZeroExtent { what: "block", .. })));
    }

    #[test]
    fn rejects_blocks_over_1024_threads() {
        let c = LaunchConfig { block: (64, 32, 1).into(), ..config(1, 1) };
        assert_eq!(check(&PLAIN, c), Err(LaunchError::BlockTooLarge { block: Dim3::new(64, 32, 1), threads: 2048 }));
        let c = LaunchConfig { block: (1, 1, 65).into(), ..config(1, 1) };
        assert!(matches!(check(&PLAIN, c), Err(LaunchError::BlockDimTooLarge { .. })));
    }

    #[test]
    fn rejects_grids_past_the_limits() {
        let c = LaunchConfig { grid: (1, 65536, 1).into(), ..config(1, 32) };
        assert!(matches!(check(&PLAIN, c), Err(LaunchError::GridDimTooLarge { .. })));
    }

    #[test]
    fn enforces_launch_bounds() {
        assert!(check(&BOUNDED, config(8, 256)).is_ok());
        assert_eq!(check(&BOUNDED, config(8, 512)), Err(LaunchError::ExceedsLaunchBounds { threads: 512, max_threads: 256 }));
    }

    #[test]
    fn takes_the_declared_cluster_and_checks_divisibility() {
        assert_eq!(check(&CLUSTER4, config(8, 128)).unwrap().cluster, Some(Dim3::new(4, 1, 1)));
        assert!(matches!(check(&CLUSTER4, config(6, 128)), Err(LaunchError::ClusterDoesNotDivideGrid { .. })));
        let c = LaunchConfig { cluster: Some(2.into()), ..config(8, 128) };
        assert!(matches!(check(&CLUSTER4, c), Err(LaunchError::ClusterMismatch { .. })));
    }

    #[test]
    fn checks_launch_time_clusters() {
        let c = LaunchConfig { cluster: Some(16.into()), ..config(32, 128) };
        let plan = check(&PLAIN, c).unwrap();
        assert!(plan.non_portable_cluster());
        let c = LaunchConfig { cluster: Some((4, 4, 2).into()), grid: (4, 4, 2).into(), ..config(1, 128) };
        assert!(matches!(check(&PLAIN, c), Err(LaunchError::ClusterTooLarge { size: 32, .. })));
        let c = LaunchConfig { cluster: Some((2, 0, 1).into()), ..config(4, 128) };
        assert!(matches!(check(&PLAIN, c), Err(LaunchError::ZeroExtent { what: "cluster", .. })));
    }

    #[test]
    fn caps_blocks_per_sm_with_shared_memory() {
        let capped = |blocks, static_smem, dynamic_smem_bytes| {
            let c = LaunchConfig { dynamic_smem_bytes, max_blocks_per_sm: Some(blocks), ..config(96, 128) };
            plan(&PLAIN, static_smem, MAX_SHARED_MEMORY_PER_BLOCK, &c).map(|p| p.dynamic_smem_bytes)
        };
        // Two blocks of 58 112 B static fit in 228 KB; padded, one does and two do not.
        let one = capped(1, 58_112, 0).unwrap();
        let per_block = 58_112 + one + RESERVED_SHARED_MEMORY_PER_BLOCK;
        assert!(per_block <= MAX_SHARED_MEMORY_PER_SM && 2 * per_block > MAX_SHARED_MEMORY_PER_SM);
        assert!(2 * (58_112 + one - 1 + RESERVED_SHARED_MEMORY_PER_BLOCK) <= MAX_SHARED_MEMORY_PER_SM);
        let three = capped(3, 0, 0).unwrap();
        assert!(4 * (three + RESERVED_SHARED_MEMORY_PER_BLOCK) > MAX_SHARED_MEMORY_PER_SM);
        assert!(3 * (three + RESERVED_SHARED_MEMORY_PER_BLOCK) <= MAX_SHARED_MEMORY_PER_SM);
        // A block that already takes more keeps what it asked for.
        assert_eq!(capped(1, 0, 150_000), Ok(150_000));
        assert_eq!(capped(0, 0, 0), Err(LaunchError::BlocksPerSmOutOfRange { blocks: 0 }));
        assert_eq!(capped(u32::MAX, 0, 0), Err(LaunchError::BlocksPerSmOutOfRange { blocks: u32::MAX }));
        assert!(capped(MAX_BLOCKS_PER_SM, 0, 0).is_ok());
        // The cap counts on the SM's whole shared memory: the carveout asks for it.
        let carveout = |max_blocks_per_sm| check(&PLAIN, LaunchConfig { max_blocks_per_sm, ..config(96, 128) }).map(|p| p.max_shared_carveout);
        assert_eq!((carveout(Some(2)), carveout(None)), (Ok(true), Ok(false)));
    }

    #[test]
    fn checks_shared_memory_against_the_limit() {
        let c = LaunchConfig { dynamic_smem_bytes: 100 * 1024, ..config(1, 128) };
        assert_eq!(plan(&PLAIN, 0, MAX_SHARED_MEMORY_PER_BLOCK, &c).map(|p| p.dynamic_smem_bytes), Ok(100 * 1024));
        let c = LaunchConfig { dynamic_smem_bytes: MAX_SHARED_MEMORY_PER_BLOCK, ..config(1, 128) };
        assert_eq!(
            plan(&PLAIN, 1024, MAX_SHARED_MEMORY_PER_BLOCK, &c),
            Err(LaunchError::SharedMemoryTooLarge { static_bytes: 1024, dynamic_bytes: MAX_SHARED_MEMORY_PER_BLOCK, limit: MAX_SHARED_MEMORY_PER_BLOCK })
        );
    }
}
