//! The host side of a persistent kernel's published buffers (`grid::Published` on the device).

use crate::buffer::Buffer;
use crate::error::{Error, Result};
use crate::gpu::Gpu;

/// A device buffer that a persistent kernel's blocks publish tile by tile and wait for
/// (`grid::Published<T>` in the kernel; pass `&mut published` to the launcher): the data, in
/// tiles of `tile` values, a flag per tile and the launch epoch, which the kernel advances as
/// it ends (so nothing needs clearing between launches).
pub struct Published<T> {
    data: Buffer<T>,
    flags: Buffer<u32>,
    tile: u32,
}

impl<T> Published<T> {
    /// `data`, published in tiles of `tile` values (the last may be shorter).
    ///
    /// # Errors
    /// [`Error::InvalidPublished`] when `tile` is zero; a driver error when the flags cannot be
    /// allocated.
    pub fn new(gpu: &Gpu, data: Buffer<T>, tile: u32) -> Result<Self> {
        if tile == 0 {
            return Err(Error::InvalidPublished(String::from("tiles of 0 values; a tile holds at least 1")));
        }
        let tiles = data.len().div_ceil(tile as usize);
        let flags = gpu.zeros(clusterfuse_device::grid::flag_words(tiles))?;
        Ok(Self { data, flags, tile })
    }

    /// The data.
    pub fn data(&self) -> &Buffer<T> {
        &self.data
    }

    /// The data, to write before a launch.
    pub fn data_mut(&mut self) -> &mut Buffer<T> {
        &mut self.data
    }

    /// Values per tile.
    pub fn tile(&self) -> u32 {
        self.tile
    }

    /// The flags: one per tile (in whole groups of four), then the epoch and the count of
    /// blocks that retired.
    pub fn flags(&self) -> &Buffer<u32> {
        &self.flags
    }

    /// New flags (after a launch that failed before every block retired).
    pub fn reset(&mut self, gpu: &Gpu) -> Result<()> {
        self.flags = gpu.zeros(self.flags.len())?;
        Ok(())
    }

    /// The data and the flags, for the launcher.
    #[doc(hidden)]
    pub fn parts_mut(&mut self) -> (&mut Buffer<T>, &mut Buffer<u32>) {
        (&mut self.data, &mut self.flags)
    }
}
