//! TMA tensor maps: `cuTensorMapEncodeTiled` on a GPU, the emulator's own encoding on the
//! CPU, uploaded to 128 bytes of device memory that kernels take as a `&[u64]`
//! (`clusterfuse::tma::TensorMap::new`).

use crate::buffer::Buffer;
use crate::error::{DriverContext, Error, Result};
use crate::gpu::Gpu;
use clusterfuse_device::emu::tensor::{encode_tensor_map, SWIZZLE_128B, SWIZZLE_64B, SWIZZLE_NONE};
use clusterfuse_device::{bf16, f16};
use cudarc::driver::sys::{
    self, CUtensorMapDataType as DataType, CUtensorMapFloatOOBfill, CUtensorMapInterleave, CUtensorMapL2promotion, CUtensorMapSwizzle,
};
use std::marker::PhantomData;

/// An element type TMA moves.
pub trait TmaElement: Copy {
    /// Its `CUtensorMapDataType`.
    const DATA_TYPE: DataType;
}

impl TmaElement for bf16 {
    const DATA_TYPE: DataType = DataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
}
impl TmaElement for f16 {
    const DATA_TYPE: DataType = DataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}
impl TmaElement for f32 {
    const DATA_TYPE: DataType = DataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
}

/// How TMA lays a box's rows out in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    /// Rows back to back.
    None,
    /// The 16-byte chunks of each 64-byte row permuted by the row's index / 2 mod 4
    /// (`CU_TENSOR_MAP_SWIZZLE_64B`), as `wgmma` reads 64-byte-swizzled operands.
    B64,
    /// The 16-byte chunks of each 128-byte row permuted by the row's index mod 8
    /// (`CU_TENSOR_MAP_SWIZZLE_128B`), as `wgmma` reads 128-byte-swizzled operands.
    B128,
}

/// A 2-D tensor map in device memory, valid while the tensor it describes is borrowed.
pub struct TensorMap<'a> {
    words: Buffer<u64>,
    _tensor: PhantomData<&'a ()>,
}

impl TensorMap<'_> {
    /// The 128 bytes, for a kernel's `&[u64]` parameter.
    pub fn words(&self) -> &Buffer<u64> {
        &self.words
    }

    /// The map, no longer tied to a borrow of its tensor: for a struct that owns the tensor
    /// and its map together and writes the tensor (through `&mut`) between launches that read
    /// it through the map.
    ///
    /// # Safety
    /// 1. The tensor's allocation outlives every launch that takes the map, and is not
    ///    replaced by another while the map is in use (its address is encoded in the map).
    pub unsafe fn detach(self) -> TensorMap<'static> {
        TensorMap { words: self.words, _tensor: PhantomData }
    }
}

impl Gpu {
    /// A tensor map of the row-major `rows × cols` matrix in `tensor`, loaded in boxes of
    /// `box_rows × box_cols`; loads past the matrix's edges read zeros.
    ///
    /// # Errors
    /// [`Error::InvalidTensorMap`] when TMA cannot describe it (rows not a multiple of 16
    /// bytes, a box over 256 in either dimension, or wider than 128 (64) bytes with the 128-byte
    /// (64-byte) swizzle, or a tensor larger than `tensor`); a driver error from `cuTensorMapEncodeTiled`.
    pub fn tensor_map_2d<'a, T: TmaElement>(
        &self,
        tensor: &'a Buffer<T>,
        (rows, cols): (usize, usize),
        (box_rows, box_cols): (u32, u32),
        swizzle: Swizzle,
    ) -> Result<TensorMap<'a>> {
        self.tensor_map(tensor, (1, rows, cols), (1, box_rows, box_cols), swizzle)
    }

    /// A tensor map of the row-major `planes × rows × cols` tensor in `tensor` (planes of
    /// `rows × cols` back to back), loaded in boxes of `box_planes × box_rows × box_cols`, which
    /// TMA writes plane after plane; loads past the tensor's edges read zeros.
    ///
    /// # Errors
    /// As [`Gpu::tensor_map_2d`], a box over 256 planes too.
    pub fn tensor_map_3d<'a, T: TmaElement>(
        &self,
        tensor: &'a Buffer<T>,
        shape: (usize, usize, usize),
        boxes: (u32, u32, u32),
        swizzle: Swizzle,
    ) -> Result<TensorMap<'a>> {
        self.tensor_map(tensor, shape, boxes, swizzle)
    }

    /// [`Gpu::tensor_map_3d`]; rank 2 when there is one plane in the tensor and the box.
    fn tensor_map<'a, T: TmaElement>(
        &self,
        tensor: &'a Buffer<T>,
        (planes, rows, cols): (usize, usize, usize),
        (box_planes, box_rows, box_cols): (u32, u32, u32),
        swizzle: Swizzle,
    ) -> Result<TensorMap<'a>> {
        let size = size_of::<T>();
        let reject = |why: String| Err(Error::InvalidTensorMap(format!("{planes} × {rows} × {cols} tensor, {box_planes} × {box_rows} × {box_cols} boxes: {why}")));
        // Sizes in elements and bytes, unless they overflow (then no buffer holds the tensor).
        let row_bytes = cols.checked_mul(size);
        let (Some(row_bytes), Some(plane_bytes), Some(elements)) = (row_bytes, row_bytes.and_then(|b| b.checked_mul(rows)), planes.checked_mul(rows).and_then(|n| n.checked_mul(cols))) else {
            return reject("its size overflows".into());
        };
        if planes == 0 || rows == 0 || cols == 0 || !row_bytes.is_multiple_of(16) {
            return reject(format!("rows must be a non-zero multiple of 16 bytes ({row_bytes} bytes)"));
        }
        // The driver's limits: extents up to 2^32, strides below 2^40 bytes (the emulator keeps to them too).
        if [planes, rows, cols].iter().any(|&d| d as u64 > 1 << 32) || plane_bytes as u64 >= 1 << 40 {
            return reject("the driver takes extents up to 2^32 elements and planes under 2^40 bytes".into());
        }
        if ![box_planes, box_rows, box_cols].iter().all(|b| (1..=256).contains(b)) || !(box_cols as usize * size).is_multiple_of(16) {
            return reject("a box is 1-256 elements in each dimension, its rows multiples of 16 bytes".into());
        }
        // The widest box row it takes, and its emulator and driver codes.
        let (span, mode, driver_mode) = match swizzle {
            Swizzle::None => (usize::MAX, SWIZZLE_NONE, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE),
            Swizzle::B64 => (64, SWIZZLE_64B, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B),
            Swizzle::B128 => (128, SWIZZLE_128B, CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B),
        };
        if box_cols as usize * size > span {
            return reject(format!("the {span}-byte swizzle takes box rows of at most {span} bytes ({})", box_cols as usize * size));
        }
        if elements > tensor.len() {
            return reject(format!("the buffer holds {} elements", tensor.len()));
        }
        let (address, _sync) = tensor.launch_ptr(self.stream())?;
        let (row_bytes, plane_bytes) = (row_bytes as u64, plane_bytes as u64);
        let words = if self.is_emulator() {
            let dims = [cols as u64, rows as u64, planes as u64];
            encode_tensor_map(address, size as u32, dims, [row_bytes, plane_bytes], [box_cols, box_rows, box_planes], mode)
        } else {
            let mut map = sys::CUtensorMap { opaque: [0; 16] };
            let rank = if planes == 1 && box_planes == 1 { 2 } else { 3 };
            let (dims, strides, boxes, steps) = ([cols as u64, rows as u64, planes as u64], [row_bytes, plane_bytes], [box_cols, box_rows, box_planes], [1u32; 3]);
            // SAFETY: every pointer is to a live local array of at least the rank's length
            // (strides: rank - 1); the address is the tensor's device allocation.
            unsafe {
                sys::cuTensorMapEncodeTiled(
                    &mut map,
                    T::DATA_TYPE,
                    rank,
                    address as *mut std::ffi::c_void,
                    dims.as_ptr(),
                    strides.as_ptr(),
                    boxes.as_ptr(),
                    steps.as_ptr(),
                    CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                    driver_mode,
                    CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
                )
            }
            .result()
            .driver("cuTensorMapEncodeTiled", None)?;
            map.opaque
        };
        Ok(TensorMap { words: self.upload(&words)?, _tensor: PhantomData })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_whose_sizes_overflow_or_pass_the_drivers_limits_are_refused() {
        let gpu = Gpu::emulator();
        let tensor = gpu.upload(&[0.0f32; 64]).unwrap();
        let refused = |shape, why: &str| match gpu.tensor_map_3d(&tensor, shape, (1, 8, 8), Swizzle::None) {
            Err(Error::InvalidTensorMap(reason)) => assert!(reason.contains(why), "{shape:?}: {reason}"),
            other => panic!("{shape:?} accepted: {:?}", other.err()),
        };
        // 2^32 · 2^32 · 8 elements wrap to 0: no longer below the buffer's 64.
        refused((1 << 32, 1 << 32, 8), "overflows");
        refused((1, 1, usize::MAX / 2), "overflows");
        refused((1, (1 << 32) + 1, 8), "2^32");
        refused((1, 1 << 32, 1 << 8), "2^40");
        refused((1, 8, 16), "holds 64 elements");
        assert!(gpu.tensor_map_3d(&tensor, (1, 8, 8), (1, 8, 8), Swizzle::None).is_ok());
    }
}
