//! Emulated Hopper tensor instructions: TMA tile loads (`cp.async.bulk.tensor.2d`/`.3d`) from the
//! emulator's own tensor maps, and `wgmma.mma_async` from shared-memory matrix descriptors.
//!
//! Both handle the 128- and 64-byte swizzles (and TMA also no swizzle); other modes, transposed
//! operands and matrix base offsets are a [`Fault`](super::Fault), never a wrong answer.

use super::mbarrier::complete_tx;
use super::memory::{self, Space};
use super::ops::{fault, global_access, HalfKind};
use super::thread::with_current;
use std::vec::Vec;

/// Marks an emulator tensor map ("cfTMAP2d").
const MAGIC: u64 = u64::from_le_bytes(*b"cfTMAP2d");

/// `CU_TENSOR_MAP_SWIZZLE_NONE`.
pub const SWIZZLE_NONE: u32 = 0;
/// `CU_TENSOR_MAP_SWIZZLE_64B`.
pub const SWIZZLE_64B: u32 = 2;
/// `CU_TENSOR_MAP_SWIZZLE_128B`.
pub const SWIZZLE_128B: u32 = 3;

/// A 2-D or 3-D tensor map as the emulator encodes it in the 128 bytes
/// `cuTensorMapEncodeTiled` fills on a GPU: the tensor at `address` (`dims` = [columns, rows,
/// planes] of `element_bytes` each, rows `strides[0]` and planes `strides[1]` bytes apart; a
/// 2-D tensor is one plane), loaded in boxes of `box_dims` = [columns, rows, planes], swizzled
/// by `swizzle` (`SWIZZLE_NONE`, `SWIZZLE_64B` or `SWIZZLE_128B`).
pub fn encode_tensor_map(address: u64, element_bytes: u32, dims: [u64; 3], strides: [u64; 2], box_dims: [u32; 3], swizzle: u32) -> [u64; 16] {
    let mut words = [0; 16];
    words[..11].copy_from_slice(&[
        MAGIC,
        address,
        dims[0],
        dims[1],
        strides[0],
        u64::from(box_dims[0]) | u64::from(box_dims[1]) << 32,
        u64::from(element_bytes),
        u64::from(swizzle),
        dims[2],
        strides[1],
        u64::from(box_dims[2]),
    ]);
    words
}

/// The swizzle of rows `row_bytes` (128 or 64) wide at a shared-memory offset: its 16-byte
/// chunk (bits 4-6, or 4-5) XOR bits 7-9 (or 7-8) — CUTLASS's `Swizzle<3, 4, 3>` (128 bytes:
/// the chunks of 8 rows of 1024 bytes) or `Swizzle<2, 4, 3>` (64 bytes: 8 rows of 512 bytes,
/// the chunks permuted by the row's index / 2).
fn swizzle(offset: u32, row_bytes: usize) -> u32 {
    let mask = (row_bytes as u32 / 16) - 1;
    offset ^ (((offset >> 7) & mask) << 4)
}

/// `cp.async.bulk.tensor.{2d,3d}.shared::cluster.global.mbarrier::complete_tx::bytes`: the box
/// at (column `c0`, row `c1`, plane `c2`; 0 for a 2-D map) of the tensor `map` describes,
/// zero-filled outside the tensor, written (swizzled) to shared `dst`, plane after plane; its
/// bytes complete on `barrier`.
///
/// # Safety
/// 1. `map` points to 128 readable bytes of global memory, an emulator tensor map whose
///    tensor is live (as `Gpu::tensor_map_2d`/`_3d` guarantee by borrowing it).
pub unsafe fn tma_load(dst: u32, map: *const [u64; 16], [c0, c1, c2]: [i32; 3], barrier: u32) {
    let words: [u64; 16] = global_access(map.cast::<u64>(), 8, || {
        // SAFETY: the caller's contract; the last word is checked to lie in a buffer too.
        global_access(unsafe { map.cast::<u64>().add(15) }, 8, || unsafe { map.read_unaligned() })
    });
    if words[0] != MAGIC {
        fault(format_args!("cp.async.bulk.tensor: the tensor map is not one the emulator made (Gpu::tensor_map_2d on the emulator)"));
    }
    let (address, dims, row_stride, elem, mode) = (words[1], [words[2], words[3], words[8]], words[4], words[6] as usize, words[7] as u32);
    let (plane_stride, box_dims) = (words[9], [words[5] as u32 as usize, (words[5] >> 32) as usize, words[10] as usize]);
    let row_bytes = box_dims[0] * elem;
    let width = match mode {
        SWIZZLE_NONE => 0,
        SWIZZLE_64B => 64,
        SWIZZLE_128B => 128,
        _ => fault(format_args!("cp.async.bulk.tensor: swizzle mode {mode} is not emulated (only none, 64 and 128 bytes)")),
    };
    if width > 0 && (row_bytes != width || !dst.is_multiple_of(8 * width as u32)) {
        fault(format_args!(
            "cp.async.bulk.tensor with the {width}-byte swizzle: the emulator needs {width}-byte box rows ({row_bytes} here) and a {}-byte-aligned destination ({dst:#x})",
            8 * width
        ))
    }
    if !dst.is_multiple_of(128) {
        fault(format_args!("cp.async.bulk.tensor to {dst:#x}: the destination must be 128-byte aligned"));
    }
    let mut data = std::vec![0u8; row_bytes * box_dims[1] * box_dims[2]];
    for (p, r) in (0..box_dims[2]).flat_map(|p| (0..box_dims[1]).map(move |r| (p, r))) {
        let (plane, row) = (i64::from(c2) + p as i64, i64::from(c1) + r as i64);
        if row < 0 || row as u64 >= dims[1] || plane < 0 || plane as u64 >= dims[2] {
            continue;
        }
        // The columns of the box inside the tensor; the rest stays zero.
        let first = (i64::from(c0)).max(0);
        let end = (i64::from(c0) + box_dims[0] as i64).min(dims[0] as i64);
        if first >= end {
            continue;
        }
        let src = (address + plane as u64 * plane_stride + row as u64 * row_stride + first as u64 * elem as u64) as *const u8;
        let len = (end - first) as usize * elem;
        let at = (p * box_dims[1] + r) * row_bytes + (first - i64::from(c0)) as usize * elem;
        // SAFETY: inside the tensor, which `Gpu::tensor_map_2d` checked against the buffer it
        // borrows for the map's lifetime (the tensor need not be a kernel argument itself, so
        // the kernel's buffer list does not cover it).
        unsafe { core::ptr::copy_nonoverlapping(src, data[at..at + len].as_mut_ptr(), len) };
    }
    // The destination may be a peer's (`mapa`): its rank bits stay on every swizzled write.
    let (window, rank) = (memory::window_of(dst), memory::rank_bits(dst));
    let base = dst & ((1 << 24) - 1);
    let bytes = data.len() as u32;
    complete_tx(dst, bytes, barrier, |index, phase| {
        if width == 0 {
            memory::async_write(dst, &data, index, phase);
        } else {
            for (chunk, piece) in data.chunks(16).enumerate() {
                let offset = swizzle(base + 16 * chunk as u32, width);
                memory::async_write(memory::in_window(window, offset) | rank, piece, index, phase);
            }
        }
    });
}

/// A decoded `wgmma` shared-memory matrix descriptor (PTX ISA §9.7.15.5.1), K-major with the
/// 128- or 64-byte swizzle: rows `row_bytes` apart in groups of 8, groups `stride` bytes apart.
struct Descriptor {
    start: u32,
    stride: u32,
    row_bytes: usize,
}

/// Reserved descriptor bits where the emulator keeps the shared window of the start address.
pub const DESCRIPTOR_WINDOW_SHIFT: u32 = 52;

impl Descriptor {
    fn decode(desc: u64, which: &str) -> Descriptor {
        let field = |shift: u32| ((desc >> shift) & 0x3fff) as u32;
        let row_bytes = match desc >> 62 {
            1 => 128,
            2 => 64,
            mode => fault(format_args!("wgmma: {which}'s descriptor has swizzle mode {mode}; the emulator handles the 128-byte (1) and 64-byte (2) swizzles only")),
        };
        if (desc >> 49) & 7 != 0 {
            fault(format_args!("wgmma: {which}'s descriptor has a matrix base offset; the emulator handles 0 only"));
        }
        let window = ((desc >> DESCRIPTOR_WINDOW_SHIFT) & 7) as u32;
        Descriptor { start: memory::in_window(window, field(0) << 4), stride: field(32) << 4, row_bytes }
    }

    /// The 16 K-values of row `row` (from the descriptor's start) as two 16-byte chunks.
    fn row(&self, row: usize, kind: HalfKind) -> [f64; 16] {
        let window = self.start & !((1 << 24) - 1);
        let offset = (self.start & ((1 << 24) - 1)) + (row % 8 * self.row_bytes) as u32 + (row / 8) as u32 * self.stride;
        let mut values = [0.0; 16];
        for chunk in 0..2 {
            let addr = window | swizzle(offset + 16 * chunk, self.row_bytes);
            let words: [u32; 4] = memory::load(addr, Space::Block);
            for (i, word) in words.iter().enumerate() {
                for h in 0..2 {
                    let bits = (word >> (16 * h)) as u16;
                    values[8 * chunk as usize + 2 * i + h] = match kind {
                        HalfKind::F16 => crate::f16::from_bits(bits).to_f64(),
                        HalfKind::Bf16 => crate::bf16::from_bits(bits).to_f64(),
                    };
                }
            }
        }
        values
    }
}

/// `wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{f16,bf16}` with both operands K-major in
/// shared memory (`imm-trans-a = imm-trans-b = 0`): this thread's `N / 2` accumulators,
/// `d = A·Bᵀ + (accumulate ? d : 0)` for A 64 × 16 at `desc_a` and B N × 16 at `desc_b`.
/// Register `4j + v` of thread `t` of the warpgroup is row `16 (t / 32) + (t % 32) / 4 + 8 (v / 2)`,
/// column `8j + 2 (t % 4) + v % 2` (PTX ISA §9.7.15.5.1's D layout). Computed at issue, from
/// shared memory as it is then; sums in f64, rounded once to f32.
pub fn wgmma_k16(kind: HalfKind, desc_a: u64, desc_b: u64, d: &mut [f32], accumulate: bool) {
    let (t, threads) = with_current(|thread| (thread.index, thread.cluster().threads_per_block));
    if threads % 128 != 0 {
        fault(format_args!("wgmma in a block of {threads} threads: warpgroups need blocks of whole multiples of 128"));
    }
    let (a, b) = (Descriptor::decode(desc_a, "A"), Descriptor::decode(desc_b, "B"));
    let (warp, lane) = ((t % 128 / 32) as usize, (t % 32) as usize);
    let row0 = 16 * warp + lane / 4;
    let a_rows = [a.row(row0, kind), a.row(row0 + 8, kind)];
    let b_rows: Vec<[f64; 16]> = (0..d.len() / 2).map(|c| b.row(8 * (c / 2) + 2 * (lane % 4) + c % 2, kind)).collect();
    for (i, value) in d.iter_mut().enumerate() {
        let (j, v) = (i / 4, i % 4);
        let (a_row, b_row) = (&a_rows[v / 2], &b_rows[2 * j + v % 2]);
        let init = if accumulate { f64::from(*value) } else { 0.0 };
        *value = (0..16).fold(init, |acc, k| acc + a_row[k] * b_row[k]) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::swizzle;

    #[test]
    fn swizzle_permutes_chunks_within_each_128_byte_row() {
        // Row 0 unchanged, row 1 swaps chunk pairs, row 7 reverses the chunks.
        assert_eq!(swizzle(0x20, 128), 0x20);
        assert_eq!(swizzle(128, 128), 128 + 16);
        assert_eq!(swizzle(7 * 128, 128), 7 * 128 + 7 * 16);
        assert_eq!(swizzle(1024 + 3 * 128 + 16, 128), 1024 + 3 * 128 + 2 * 16);
    }

    #[test]
    fn swizzle_permutes_chunks_within_each_64_byte_row_by_its_pair_of_rows() {
        // Rows 0-1 unchanged, rows 2-3 swap chunk pairs, rows 6-7 reverse the chunks; the
        // pattern repeats every 512 bytes.
        assert_eq!(swizzle(64 + 16, 64), 64 + 16);
        assert_eq!(swizzle(2 * 64, 64), 2 * 64 + 16);
        assert_eq!(swizzle(7 * 64 + 16, 64), 7 * 64 + 2 * 16);
        assert_eq!(swizzle(512 + 4 * 64 + 48, 64), 512 + 4 * 64 + 16);
    }
}
