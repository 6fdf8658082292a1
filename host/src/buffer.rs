//! Device buffers: cudarc allocations on a GPU, host memory on the emulator.

use crate::error::{Error, Result};
use crate::gpu::Stream;
use std::sync::Arc;
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr, DevicePtrMut, SyncOnDrop};
use std::marker::PhantomData;

/// `len` values of `T` in device memory, as kernels take them (`&buffer` for a `&[T]`
/// parameter, `&mut buffer` for an `Out<T>`). Made by [`Gpu::upload`](crate::Gpu::upload)
/// and [`Gpu::zeros`](crate::Gpu::zeros), or over memory another owner allocated by
/// [`Buffer::from_raw`].
pub struct Buffer<T> {
    storage: Storage<T>,
}

enum Storage<T> {
    Cuda(CudaSlice<T>),
    Emulated(Vec<T>),
    /// Memory of another owner: its address, length, and GPU (None: host memory, for the
    /// emulator). Not freed on drop.
    Borrowed { address: u64, len: usize, context: Option<Arc<CudaContext>>, values: PhantomData<T> },
}

/// A buffer's address for one launch, with cudarc's guard that orders the launch after the
/// buffer's earlier uses on other streams.
pub type LaunchPtr<'a> = (u64, Option<SyncOnDrop<'a>>);

impl<T> Buffer<T> {
    pub(crate) fn emulated(values: Vec<T>) -> Self {
        Self { storage: Storage::Emulated(values) }
    }

    /// A buffer over `len` values of `T` at `address` that another owner allocated (a
    /// framework's tensor, say), for launches on `stream`: device memory of `stream`'s GPU,
    /// or on the emulator host memory. Dropping the buffer leaves the memory alone; only
    /// launches read or write it.
    ///
    /// # Safety
    /// 1. `address` points to `len` initialised values of `T`, aligned for `T` (16-byte
    ///    vector loads need 16), in memory of `stream`'s device: an allocation in the
    ///    context of `stream`'s GPU, or host memory on the emulator.
    /// 2. The memory stays allocated until every launch given the buffer has completed.
    /// 3. Nothing else accesses it while such a launch may run, except in `stream`'s order
    ///    (work queued on `stream` before or after the launch), and no Rust reference to it
    ///    (host memory) is used while a launch writes it.
    pub unsafe fn from_raw(stream: &Stream, address: u64, len: usize) -> Self {
        let context = stream.cuda().map(|s| s.context().clone());
        Self { storage: Storage::Borrowed { address, len, context, values: PhantomData } }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.storage {
            Storage::Cuda(slice) => slice.len(),
            Storage::Emulated(values) => values.len(),
            Storage::Borrowed { len, .. } => *len,
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
            Storage::Emulated(_) | Storage::Borrowed { .. } => None,
        }
    }

    /// The emulator's memory (None on a GPU).
    pub(crate) fn as_emulated(&self) -> Option<&[T]> {
        match &self.storage {
            Storage::Emulated(values) => Some(values),
            Storage::Cuda(_) | Storage::Borrowed { .. } => None,
        }
    }

    /// The address a launch on `stream` passes for this buffer, read-only.
    ///
    /// # Errors
    /// [`Error::WrongBackend`] when the buffer and the stream belong to different devices (two
    /// GPUs, or a GPU and the emulator); [`Error::UnorderedStream`] when nothing would order
    /// the launch with the buffer's upload and free (another stream of a context without
    /// cudarc's event tracking).
    pub fn launch_ptr<'a>(&'a self, stream: &'a Stream) -> Result<LaunchPtr<'a>> {
        match (&self.storage, stream.cuda()) {
            (Storage::Cuda(slice), Some(cuda)) if Arc::ptr_eq(slice.context(), cuda.context()) => {
                check_ordered(slice, stream)?;
                let (ptr, sync) = slice.device_ptr(cuda);
                Ok((ptr, Some(sync)))
            }
            (Storage::Emulated(values), None) => Ok((values.as_ptr() as u64, None)),
            (Storage::Borrowed { address, context, .. }, stream) => borrowed(*address, context, stream),
            _ => Err(Error::WrongBackend),
        }
    }

    /// The address a launch on `stream` passes for this buffer, written by the kernel.
    ///
    /// # Errors
    /// As for [`Buffer::launch_ptr`].
    pub fn launch_ptr_mut<'a>(&'a mut self, stream: &'a Stream) -> Result<LaunchPtr<'a>> {
        match (&mut self.storage, stream.cuda()) {
            (Storage::Cuda(slice), Some(cuda)) if Arc::ptr_eq(slice.context(), cuda.context()) => {
                check_ordered(slice, stream)?;
                let (ptr, sync) = slice.device_ptr_mut(cuda);
                Ok((ptr, Some(sync)))
            }
            (Storage::Emulated(values), None) => Ok((values.as_mut_ptr() as u64, None)),
            (Storage::Borrowed { address, context, .. }, stream) => borrowed(*address, context, stream),
            _ => Err(Error::WrongBackend),
        }
    }
}

/// [`Error::UnorderedStream`] unless a launch on `stream` is ordered after `slice`'s upload
/// and before its free: by cudarc's guard where its context tracks events, else only on the
/// stream the slice was made on, or in a graph capture (replayed on the buffers' stream:
/// [`Graph::replay`](crate::Graph::replay)'s contract).
fn check_ordered<T>(slice: &CudaSlice<T>, stream: &Stream) -> Result<()> {
    let same_stream = stream.cuda().is_some_and(|cuda| cuda.cu_stream() == slice.stream().cu_stream());
    if slice.context().is_event_tracking() || stream.is_capture() || same_stream {
        Ok(())
    } else {
        Err(Error::UnorderedStream)
    }
}

/// A borrowed buffer's address for a launch on `stream`, if both are of one device. No
/// guard: the owner orders its uses ([`Buffer::from_raw`]).
fn borrowed<'a>(address: u64, context: &Option<Arc<CudaContext>>, stream: Option<&Arc<cudarc::driver::CudaStream>>) -> Result<LaunchPtr<'a>> {
    match (context, stream) {
        (Some(context), Some(stream)) if Arc::ptr_eq(context, stream.context()) => Ok((address, None)),
        (None, None) => Ok((address, None)),
        _ => Err(Error::WrongBackend),
    }
}

impl<T> From<CudaSlice<T>> for Buffer<T> {
    fn from(slice: CudaSlice<T>) -> Self {
        Self { storage: Storage::Cuda(slice) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Gpu;

    #[test]
    fn a_borrowed_buffer_passes_its_address_to_launches_and_leaves_the_memory_alone() {
        let gpu = Gpu::emulator();
        let mut values = vec![1.0f32, 2.0, 3.0];
        let address = values.as_mut_ptr() as u64;
        // SAFETY: host memory for the emulator, alive and not otherwise used while the buffer is.
        let mut buffer = unsafe { Buffer::<f32>::from_raw(gpu.stream(), address, values.len()) };
        assert_eq!(buffer.len(), 3);
        assert!(buffer.as_cuda().is_none() && buffer.as_emulated().is_none());
        assert_eq!(buffer.launch_ptr(gpu.stream()).map(|(a, _)| a).ok(), Some(address));
        assert_eq!(buffer.launch_ptr_mut(gpu.stream()).map(|(a, _)| a).ok(), Some(address));
        drop(buffer);
        assert_eq!(values, [1.0, 2.0, 3.0]);
    }
}
