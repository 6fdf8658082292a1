//! Hopper's hardware limits: the one list that the macros (compile-time checks), the
//! host runtime (launch-time checks) and the device library all read.
//!
//! Figures are those of compute capability 9.0 (CUDA C++ Programming Guide, "Technical
//! Specifications per Compute Capability").

/// Threads in a warp.
pub const WARP_SIZE: u32 = 32;
/// Warps in a warpgroup (the unit that issues `wgmma`).
pub const WARPGROUP_WARPS: u32 = 4;
/// Most threads in one block.
pub const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Largest block extent per dimension (x, y, z).
pub const MAX_BLOCK_DIM: [u32; 3] = [1024, 1024, 64];
/// Largest grid extent per dimension (x, y, z).
pub const MAX_GRID_DIM: [u32; 3] = [i32::MAX as u32, 65535, 65535];
/// Shared memory of one multiprocessor (228 KB), which its resident blocks share.
pub const MAX_SHARED_MEMORY_PER_SM: u32 = 228 * 1024;
/// Shared memory the system reserves for each resident block, beside what it declares.
pub const RESERVED_SHARED_MEMORY_PER_BLOCK: u32 = 1024;
/// Most shared memory one block may use, static and dynamic together (227 KB): the SM's,
/// less the block's reserve.
pub const MAX_SHARED_MEMORY_PER_BLOCK: u32 = MAX_SHARED_MEMORY_PER_SM - RESERVED_SHARED_MEMORY_PER_BLOCK;
/// Dynamic shared memory a kernel may take without opting in through
/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`.
pub const DEFAULT_DYNAMIC_SHARED_MEMORY: u32 = 48 * 1024;
/// Most static shared memory (`.shared` variables) a kernel may declare: ptxas refuses more
/// ("too much shared data", 0xc000 max); past it, memory must be dynamic.
pub const MAX_STATIC_SHARED_MEMORY: u32 = 48 * 1024;
/// Largest cluster every Hopper part guarantees.
pub const MAX_PORTABLE_CLUSTER_SIZE: u32 = 8;
/// Largest cluster with the non-portable opt-in.
pub const MAX_CLUSTER_SIZE: u32 = 16;
/// Most blocks resident on one multiprocessor.
pub const MAX_BLOCKS_PER_SM: u32 = 32;
/// 32-bit registers of one multiprocessor, which its resident blocks share.
pub const REGISTERS_PER_SM: u32 = 64 * 1024;
/// Registers are allocated to a warp in units of this many a thread (256 a warp).
pub const REGISTER_ALLOCATION_UNIT: u32 = 8;
