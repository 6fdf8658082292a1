//! Device buffers: cudarc allocations on a GPU, host memory on the emulator.

use crate::error::{Error, Result};
use crate::gpu::Stream;
use std::sync::Arc;
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, SyncOnDrop};

/// `len` values of `T` in device memory, as kernels take them (`&buffer` for a `&[T]`
/// parameter, `&mut buffer` for an `Out<T>`). Made by [`Gpu::upload`](crate::Gpu::upload)
/// and [`Gpu::zeros`](crate::Gpu::zeros).
pub struct Buffer<T> {
    storage: Storage<T>,
}

enum Storage<T> {
    Cuda(CudaSlice<T>),
    Emulated(Vec<T>),
}

/// A buffer's address for one launch, with cudarc's guard that orders the launch after the
/// buffer's earlier uses on other streams.
pub type LaunchPtr<'a> = (u64, Option<SyncOnDrop<'a>>);

impl<T> Buffer<T> {
    pub(crate) fn emulated(values: Vec<T>) -> Self {
        Self { storage: Storage::Emulated(values) }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Cuda(slice) => slice.len(),
            Storage::Emulated(values) => values.len(),
        }
    }

    /// True when the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cudarc allocation, for anything this crate does not wrap (None on the emulator).
    pub fn as_cuda(&self) -> Option<&CudaSlice<T>> {
        match &self.storage {
            Storage::Cuda(slice) => Some(slice),
            Storage::Emulated(_) => None,
        }
    }

    /// The emulator's memory (None on a GPU).
    pub(crate) fn as_emulated(&self) -> Option<&[T]> {
        match &self.storage {
            Storage::Cuda(_) => None,
            Storage::Emulated(values) => Some(values),
        }
    }

    /// The address a launch on `stream` passes for this buffer, read-only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] when the buffer and the stream belong to different devices (two
    /// GPUs, or a GPU and the emulator).
    pub fn launch_ptr<'a>(&'a self, stream: &'a Stream) -> Result<LaunchPtr<'a>> {
        match (&self.storage, stream.cuda()) {
            (Storage::Cuda(slice), Some(stream)) if Arc::ptr_eq(slice.context(), stream.context()) => {
                let (ptr, sync) = slice.device_ptr(stream);
                Ok((ptr, Some(sync)))
            }
            (Storage::Emulated(values), None) => Ok((values.as_ptr() as u64, None)),
            _ => Err(Error::WrongBackend),
        }
    }

    /// The address a launch on `stream` passes for this buffer, written by the kernel.
    ///
    /// # Errors
    /// As for [`Buffer::launch_ptr`].
    pub fn launch_ptr_mut<'a>(&'a mut self, stream: &'a Stream) -> Result<LaunchPtr<'a>> {
        match (&mut self.storage, stream.cuda()) {
            (Storage::Cuda(slice), Some(stream)) if Arc::ptr_eq(slice.context(), stream.context()) => {
                let (ptr, sync) = slice.device_ptr_mut(stream);
                Ok((ptr, Some(sync)))
            }
            (Storage::Emulated(values), None) => Ok((values.as_mut_ptr() as u64, None)),
            _ => Err(Error::WrongBackend),
        }
    }
}

impl<T> From<CudaSlice<T>> for Buffer<T> {
    fn from(slice: CudaSlice<T>) -> Self {
        Self { storage: Storage::Cuda(slice) }
    }
}
