//! clusterfuse's Llama decode kernels ([`clusterfuse_kernels::llama::chain`]) as
//! [candle](https://github.com/huggingface/candle) custom ops.
//!
//! On a CUDA tensor an op launches the clusterfuse kernel on the tensor's own memory, in
//! candle's own stream: [`Kernels::new`] makes a clusterfuse [`Gpu`] on the candle device's
//! cudarc stream ([`Gpu::on_stream`]), and each op hands the kernel the device addresses of
//! candle's `CudaSlice`s ([`Buffer::from_raw`]), taken with cudarc's guards as candle's own
//! kernels take them. Nothing is copied through the host, and the launches are ordered with
//! candle's in its stream. This works because candle 0.11 and clusterfuse share one cudarc
//! (0.19): candle's `CudaSlice<bf16>` is clusterfuse's. On a CPU tensor the same kernel runs
//! on the CPU emulator ([`Gpu::emulator`]), on copies of the inputs, so that the ops are
//! tested without a GPU.
//!
//! The ops, each one or two fused launches of a Llama decode step at batch 1 (bf16 weights
//! and KV cache, f32 activations; heads of 64, see [`Kernels`]):
//! - [`Kernels::attention`]: RMSNorm → QKV projection → RoPE → k, v appended to the caches
//!   (in place) → grouped-query flash-decoding over the cache;
//! - [`Kernels::residual`]: `h += W·x`, in place (the output and down projections);
//! - [`Kernels::gate_up`]: RMSNorm → gate and up projections → `silu(gate)·up`;
//! - [`Kernels::lm_head`]: the final RMSNorm and the logits.
//!
//! [`model`] builds a Llama-architecture model from them and, beside it, the same model in
//! candle's own ops.
//!
//! ```no_run
//! # fn main() -> candle_core::Result<()> {
//! use candle_core::{DType, Device, Tensor};
//! use clusterfuse_candle::Kernels;
//!
//! let device = Device::Cpu; // or Device::new_cuda(0)? with the `cuda` feature
//! let kernels = Kernels::new(&device)?;
//! let h = Tensor::randn(0f32, 1.0, 256, &device)?;
//! let norm_w = Tensor::ones(256, DType::BF16, &device)?;
//! let w_gate_up = (Tensor::randn(0f32, 0.06, (2 * 4096, 256), &device)?).to_dtype(DType::BF16)?;
//! let act = kernels.gate_up(&h, &norm_w, &w_gate_up)?; // 4096 values: silu(gate)·up
//! # let _ = act; Ok(()) }
//! ```
//!
//! Build: `cargo test -p clusterfuse-candle` needs no CUDA (candle's CPU backend, the
//! emulator); `--features cuda` turns on candle's CUDA backend, which compiles CUDA C++ and
//! links the CUDA libraries (`scripts/setup-candle.sh` installs them on a machine without
//! CUDA), and makes clusterfuse link libcuda as candle's cudarc does.

pub mod model;

use candle_core::{bail, CpuStorage, CustomOp1, CustomOp3, DType, Device, InplaceOp3, Layout, Result, Shape, Storage, Tensor};
use clusterfuse::bf16;
use clusterfuse::host::cudarc::driver::DeviceRepr;
use clusterfuse::host::{Buffer, Gpu, LaunchConfig};
use clusterfuse_kernels::llama::chain::host::{attention_config, projection_config};
use clusterfuse_kernels::llama::chain::{self, chunks, HEAD_DIM, MAX_CLUSTER, MAX_GROUP, WARPS};

/// Blocks per cluster of the attention on a GPU (each KV head's cached tokens split over 8
/// blocks), and on the emulator (fewer threads to interleave).
const CLUSTER: [u32; 2] = [8, 4];
const _: () = assert!(CLUSTER[0] as usize <= MAX_CLUSTER && CLUSTER[1] as usize <= MAX_CLUSTER);

/// A clusterfuse error as a candle one.
fn wrap(e: clusterfuse::host::Error) -> candle_core::Error {
    candle_core::Error::wrap(e)
}

/// The kernels, loaded for one candle device: on a CUDA device, on its context and stream;
/// on the CPU, on the emulator. Made once, used for every op on that device's tensors.
///
/// Shapes the kernels support: hidden = heads × 64; 1 to 4 query heads per KV head; every
/// projection's input length (hidden, MLP width) a multiple of 8 whose chunks of 2048 divide
/// the block's 8 warps (at most 16 384); an even number of output rows. Anything else, and
/// any tensor of another dtype, shape or device, is an error before anything is launched.
pub struct Kernels {
    device: Device,
    gpu: Gpu,
    /// Projection blocks the device holds at once (two per SM; 4 on the emulator).
    resident: u32,
    cluster: u32,
    qkv: chain::llama_qkv::Kernel,
    attention: chain::llama_attention::Kernel,
    residual: chain::llama_residual::Kernel,
    gate_up: chain::llama_gate_up::Kernel,
    lm_head: chain::llama_lm_head::Kernel,
}

impl Kernels {
    /// Loads the kernels for `device`: a CUDA device (a Hopper GPU; needs the `cuda` feature)
    /// or the CPU (the emulator).
    pub fn new(device: &Device) -> Result<Self> {
        let (gpu, cluster) = match device {
            Device::Cpu => (Gpu::emulator(), CLUSTER[1]),
            #[cfg(feature = "cuda")]
            Device::Cuda(cuda) => (Gpu::on_stream(cuda.cuda_stream()).map_err(wrap)?, CLUSTER[0]),
            _ => bail!("clusterfuse-candle runs on CUDA devices (with the `cuda` feature) and the CPU, not on {device:?}"),
        };
        let resident = 2 * gpu.multiprocessors().map_err(wrap)?.unwrap_or(2) as u32;
        Ok(Self {
            device: device.clone(),
            resident,
            cluster,
            qkv: chain::llama_qkv::load(&gpu).map_err(wrap)?,
            attention: chain::llama_attention::load(&gpu).map_err(wrap)?,
            residual: chain::llama_residual::load(&gpu).map_err(wrap)?,
            gate_up: chain::llama_gate_up::load(&gpu).map_err(wrap)?,
            lm_head: chain::llama_lm_head::load(&gpu).map_err(wrap)?,
            gpu,
        })
    }

    /// The candle device the kernels run on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Checks that `t` is a `dtype` tensor of `dims` on this device.
    fn check(&self, name: &str, t: &Tensor, dtype: DType, dims: &[usize]) -> Result<()> {
        if t.dtype() != dtype || t.dims() != dims {
            bail!("{name}: expected a {dtype:?} tensor of shape {dims:?}, got {:?} of {:?}", t.dtype(), t.dims());
        }
        if !t.device().same_device(&self.device) {
            bail!("{name} is on {:?}, the kernels on {:?}", t.device(), self.device);
        }
        Ok(())
    }

    /// The attention of one layer at `position`: `q, k, v = W_qkv · RMSNorm(h)·norm_w`, RoPE
    /// (rotate-half, the table's factors) on q and k, k and v rounded to bf16 and written to
    /// the caches at `position`, then each query head's attention over its KV head's tokens
    /// `0 ..= position`. Returns the heads' outputs, f32 `(heads·64)`. Two launches: the
    /// fused projection, and flash-decoding with a cluster per KV head.
    ///
    /// `h`: f32 `(hidden)`; `norm_w`: bf16 `(hidden)`; `w_qkv`: bf16 `(heads·64 + 2·kv_heads·64,
    /// hidden)`, the q, k, v heads' rows; `rope`: f32 `(max_len, 64)`, per position 32 cosines
    /// then 32 sines ([`chain::host::rope_table`]); `position`: u32 `(1)`; the caches: bf16
    /// `(kv_heads, max_len, 64)`, contiguous, written in place at `position` (the op writes
    /// their memory directly, as a KV cache is meant to be; do not hold other tensors that
    /// share their storage across the call). A `position` past the caches stops the kernel
    /// with an error (on a GPU, a trap, after which the context is unusable).
    #[allow(clippy::too_many_arguments)]
    pub fn attention(&self, h: &Tensor, norm_w: &Tensor, w_qkv: &Tensor, rope: &Tensor, position: &Tensor, k_cache: &Tensor, v_cache: &Tensor) -> Result<Tensor> {
        let hidden = h.elem_count();
        let (kv_heads, max_len, _) = k_cache.dims3()?;
        let kv_rows = kv_heads * HEAD_DIM;
        let rows = w_qkv.dim(0)?;
        if !hidden.is_multiple_of(HEAD_DIM) || rows < hidden + 2 * kv_rows || kv_heads == 0 {
            bail!("attention: hidden {hidden} is not whole heads of {HEAD_DIM}, or W_qkv's {rows} rows are not its q rows and {kv_heads} KV heads' k and v rows");
        }
        let heads = hidden / HEAD_DIM;
        if !heads.is_multiple_of(kv_heads) || heads / kv_heads > MAX_GROUP {
            bail!("attention: {heads} query heads over {kv_heads} KV heads; each KV head serves 1 to {MAX_GROUP}");
        }
        self.check_projection("attention", hidden, rows)?;
        self.check("h", h, DType::F32, &[hidden])?;
        self.check("norm_w", norm_w, DType::BF16, &[hidden])?;
        self.check("w_qkv", w_qkv, DType::BF16, &[hidden + 2 * kv_rows, hidden])?;
        self.check("rope", rope, DType::F32, &[max_len, HEAD_DIM])?;
        self.check("position", position, DType::U32, &[1])?;
        self.check("k_cache", k_cache, DType::BF16, &[kv_heads, max_len, HEAD_DIM])?;
        self.check("v_cache", v_cache, DType::BF16, &[kv_heads, max_len, HEAD_DIM])?;
        let op = Attention { kernels: self, norm_w, w_qkv, rope, position, k_cache, v_cache };
        h.apply_op1_no_bwd(&op)
    }

    /// `h += w · x` in place (the output projection, or the down projection): `h` f32 `(n)`,
    /// `w` bf16 `(n, k)`, `x` f32 `(k)`. One launch.
    pub fn residual(&self, h: &Tensor, w: &Tensor, x: &Tensor) -> Result<()> {
        let (n, k) = w.dims2()?;
        self.check_projection("residual", k, n)?;
        self.check("h", h, DType::F32, &[n])?;
        self.check("x", x, DType::F32, &[k])?;
        self.check("w", w, DType::BF16, &[n, k])?;
        h.inplace_op3(x, w, &Residual { kernels: self })
    }

    /// The MLP's input: `silu(gate) · up` with `[gate; up] = w_gate_up · RMSNorm(h)·norm_w`.
    /// `h` f32 `(hidden)`, `norm_w` bf16 `(hidden)`, `w_gate_up` bf16 `(2·inter, hidden)`, the
    /// gate rows then the up rows; returns f32 `(inter)`. One launch.
    pub fn gate_up(&self, h: &Tensor, norm_w: &Tensor, w_gate_up: &Tensor) -> Result<Tensor> {
        self.check_normed_projection("gate_up", h, norm_w, ("w_gate_up", w_gate_up))?;
        h.apply_op3_no_bwd(norm_w, w_gate_up, &GateUp { kernels: self })
    }

    /// The logits: `embedding · RMSNorm(h)·norm_w`. `h` f32 `(hidden)`, `norm_w` bf16
    /// `(hidden)`, `embedding` bf16 `(vocab, hidden)`, vocab even; returns f32 `(vocab)`. One
    /// launch.
    pub fn lm_head(&self, h: &Tensor, norm_w: &Tensor, embedding: &Tensor) -> Result<Tensor> {
        self.check_normed_projection("lm_head", h, norm_w, ("embedding", embedding))?;
        h.apply_op3_no_bwd(norm_w, embedding, &LmHead { kernels: self })
    }

    /// The operands of an op that projects `RMSNorm(h)·norm_w` by `w` (`rows × hidden`): `h`
    /// f32 `(hidden)`, `norm_w` bf16 `(hidden)`, `w` bf16, a projection the kernels take.
    fn check_normed_projection(&self, op: &str, h: &Tensor, norm_w: &Tensor, (name, w): (&str, &Tensor)) -> Result<()> {
        let (rows, hidden) = w.dims2()?;
        self.check_projection(op, hidden, rows)?;
        self.check("h", h, DType::F32, &[hidden])?;
        self.check("norm_w", norm_w, DType::BF16, &[hidden])?;
        self.check(name, w, DType::BF16, &[rows, hidden])
    }

    /// A projection of `rows` rows over `k` columns: rows in pairs, columns in 16-byte
    /// vectors, chunks of 2048 columns that divide the block's warps.
    fn check_projection(&self, op: &str, k: usize, rows: usize) -> Result<()> {
        if k == 0 || !k.is_multiple_of(8) || !WARPS.is_multiple_of(chunks(k)) || rows == 0 || !rows.is_multiple_of(2) {
            bail!("{op}: {rows} rows of {k} columns; the kernels take an even number of rows, and columns in 16-byte vectors split into 1, 2, 4 or 8 chunks of up to 2048");
        }
        Ok(())
    }

    /// A projection's launch over `pairs` row pairs of `k` columns.
    fn projection(&self, pairs: usize, k: usize) -> LaunchConfig {
        projection_config(pairs, k, self.resident, !self.gpu.is_emulator())
    }
}

/// A tensor's values on the emulator: a copy of its contiguous part of `storage`.
fn emulated<T: candle_core::WithDType + DeviceRepr>(gpu: &Gpu, storage: &CpuStorage, layout: &Layout) -> Result<Buffer<T>> {
    let Some((start, end)) = layout.contiguous_offsets() else { bail!("clusterfuse-candle needs contiguous tensors") };
    gpu.upload(&storage.as_slice::<T>()?[start..end]).map_err(wrap)
}

/// The emulator's values of `buffer`.
fn download<T: DeviceRepr + Copy>(gpu: &Gpu, buffer: &Buffer<T>) -> Result<Vec<T>> {
    gpu.download(buffer).map_err(wrap)
}

/// The storage of a tensor the op takes beside its operands.
fn cpu_storage<'a>(storage: &'a Storage, name: &str) -> Result<&'a CpuStorage> {
    match storage {
        Storage::Cpu(cpu) => Ok(cpu),
        _ => bail!("{name} is not on the CPU"),
    }
}

/// See [`Kernels::attention`].
struct Attention<'a> {
    kernels: &'a Kernels,
    norm_w: &'a Tensor,
    w_qkv: &'a Tensor,
    rope: &'a Tensor,
    position: &'a Tensor,
    k_cache: &'a Tensor,
    v_cache: &'a Tensor,
}

impl Attention<'_> {
    /// Both launches, on buffers of one device.
    #[allow(clippy::too_many_arguments)]
    fn launch(&self, h: &mut Buffer<f32>, norm_w: &Buffer<bf16>, w_qkv: &Buffer<bf16>, rope: &Buffer<f32>, position: &Buffer<u32>, q: &mut Buffer<f32>, k_cache: &mut Buffer<bf16>, v_cache: &mut Buffer<bf16>, attn: &mut Buffer<f32>) -> Result<()> {
        let k = self.kernels;
        let (s, p) = (k.gpu.stream(), !k.gpu.is_emulator());
        let (kv_heads, max_len, _) = self.k_cache.dims3()?;
        let hidden = h.len();
        // One layer's attention: the MLP and vocabulary do not matter to these launches.
        let shape = chain::host::Shape { layers: 1, hidden, heads: hidden / HEAD_DIM, kv_heads, inter: hidden, vocab: 2, max_len };
        k.qkv.launch(s, &k.projection(shape.qkv_rows() / 2, hidden), h, norm_w, w_qkv, rope, position, q, k_cache, v_cache, max_len as u32).map_err(wrap)?;
        k.attention.launch(s, &attention_config(shape, k.cluster, p), q, k_cache, v_cache, position, attn, max_len as u32).map_err(wrap)
    }
}

impl CustomOp1 for Attention<'_> {
    fn name(&self) -> &'static str {
        "clusterfuse-attention"
    }

    /// On the emulator, on copies; the appended k and v rows are then written to the caches
    /// (`slice_set`).
    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let gpu = &self.kernels.gpu;
        let mut h = emulated::<f32>(gpu, storage, layout)?;
        macro_rules! take {
            ($t:expr, $ty:ty, $name:literal) => {{
                let (storage, layout) = $t.storage_and_layout();
                emulated::<$ty>(gpu, cpu_storage(&storage, $name)?, layout)?
            }};
        }
        let (norm_w, w_qkv, rope, position) = (take!(self.norm_w, bf16, "norm_w"), take!(self.w_qkv, bf16, "w_qkv"), take!(self.rope, f32, "rope"), take!(self.position, u32, "position"));
        let (mut k_cache, mut v_cache) = (take!(self.k_cache, bf16, "k_cache"), take!(self.v_cache, bf16, "v_cache"));
        let hidden = h.len();
        let mut q = gpu.upload(&vec![f32::NAN; hidden]).map_err(wrap)?;
        let mut attn = gpu.upload(&vec![f32::NAN; hidden]).map_err(wrap)?;
        self.launch(&mut h, &norm_w, &w_qkv, &rope, &position, &mut q, &mut k_cache, &mut v_cache, &mut attn)?;
        let pos = download(gpu, &position)?[0] as usize;
        let (kv_heads, max_len, _) = self.k_cache.dims3()?;
        for (cache, tensor) in [(&k_cache, self.k_cache), (&v_cache, self.v_cache)] {
            let values = download(gpu, cache)?;
            let rows: Vec<bf16> = (0..kv_heads).flat_map(|head| values[(head * max_len + pos) * HEAD_DIM..][..HEAD_DIM].to_vec()).collect();
            tensor.slice_set(&Tensor::from_vec(rows, (kv_heads, 1, HEAD_DIM), &Device::Cpu)?, 1, pos)?;
        }
        Ok((CpuStorage::F32(download(gpu, &attn)?), Shape::from(hidden)))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, storage: &candle_core::CudaStorage, layout: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
        use cuda::{alloc, borrow, whole};
        let stream = self.kernels.gpu.stream();
        let hidden = layout.shape().elem_count();
        let guards = [self.norm_w, self.w_qkv, self.rope, self.position, self.k_cache, self.v_cache].map(Tensor::storage_and_layout);
        let [norm_w, w_qkv, rope, position, k_cache, v_cache] = &guards;
        let device = &storage.device;
        let (q_slice, attn_slice) = (alloc::<f32>(device, hidden)?, alloc::<f32>(device, hidden)?);
        // SAFETY (every `borrow` and `whole`): candle's memory, of the kernels' device, borrowed
        // (the storage guards) until the launches are queued in candle's stream, in order with
        // its other work. The caches are written in place (see `Kernels::attention`).
        unsafe {
            let (mut h, _g1) = borrow::<f32>(stream, storage, layout)?;
            let (norm_w, _g2) = borrow::<bf16>(stream, cuda::storage(&norm_w.0)?, norm_w.1)?;
            let (w_qkv, _g3) = borrow::<bf16>(stream, cuda::storage(&w_qkv.0)?, w_qkv.1)?;
            let (rope, _g4) = borrow::<f32>(stream, cuda::storage(&rope.0)?, rope.1)?;
            let (position, _g5) = borrow::<u32>(stream, cuda::storage(&position.0)?, position.1)?;
            let (mut k_cache, _g6) = borrow::<bf16>(stream, cuda::storage(&k_cache.0)?, k_cache.1)?;
            let (mut v_cache, _g7) = borrow::<bf16>(stream, cuda::storage(&v_cache.0)?, v_cache.1)?;
            let (mut q, _g8) = whole(stream, &q_slice)?;
            let (mut attn, _g9) = whole(stream, &attn_slice)?;
            self.launch(&mut h, &norm_w, &w_qkv, &rope, &position, &mut q, &mut k_cache, &mut v_cache, &mut attn)?;
        }
        Ok((candle_core::CudaStorage::wrap_cuda_slice(attn_slice, device.clone()), Shape::from(hidden)))
    }
}

/// See [`Kernels::residual`].
struct Residual<'a> {
    kernels: &'a Kernels,
}

impl InplaceOp3 for Residual<'_> {
    fn name(&self) -> &'static str {
        "clusterfuse-residual"
    }

    fn cpu_fwd(&self, h: &mut CpuStorage, hl: &Layout, x: &CpuStorage, xl: &Layout, w: &CpuStorage, wl: &Layout) -> Result<()> {
        let k = self.kernels;
        let (mut hb, mut xb, wb) = (emulated::<f32>(&k.gpu, h, hl)?, emulated::<f32>(&k.gpu, x, xl)?, emulated::<bf16>(&k.gpu, w, wl)?);
        let config = k.projection(hb.len() / 2, xb.len());
        k.residual.launch(k.gpu.stream(), &config, &mut xb, &wb, &mut hb).map_err(wrap)?;
        let (CpuStorage::F32(values), Some((start, end))) = (h, hl.contiguous_offsets()) else { bail!("h: a contiguous f32 tensor") };
        values[start..end].copy_from_slice(&download(&k.gpu, &hb)?);
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, h: &mut candle_core::CudaStorage, hl: &Layout, x: &candle_core::CudaStorage, xl: &Layout, w: &candle_core::CudaStorage, wl: &Layout) -> Result<()> {
        let k = self.kernels;
        let stream = k.gpu.stream();
        // SAFETY: as in `Attention::cuda_fwd`; `h` is the op's to write.
        unsafe {
            let (mut hb, _g1) = cuda::borrow::<f32>(stream, h, hl)?;
            let (mut xb, _g2) = cuda::borrow::<f32>(stream, x, xl)?;
            let (wb, _g3) = cuda::borrow::<bf16>(stream, w, wl)?;
            k.residual.launch(stream, &k.projection(hb.len() / 2, xb.len()), &mut xb, &wb, &mut hb).map_err(wrap)
        }
    }
}

/// See [`Kernels::gate_up`].
struct GateUp<'a> {
    kernels: &'a Kernels,
}

/// See [`Kernels::lm_head`].
struct LmHead<'a> {
    kernels: &'a Kernels,
}

/// The ops of one normalised projection `f(W · RMSNorm(h)·norm_w)`: the gate/up and LM-head
/// kernels, which take the same arguments.
macro_rules! normed_projection {
    ($op:ident, $name:literal, $kernel:ident, |$rows:ident| $outputs:expr, |$out:ident| $pairs:expr) => {
        impl $op<'_> {
            fn launch(&self, h: &mut Buffer<f32>, norm_w: &Buffer<bf16>, w: &Buffer<bf16>, out: &mut Buffer<f32>) -> Result<()> {
                let k = self.kernels;
                let $out = out.len();
                k.$kernel.launch(k.gpu.stream(), &k.projection($pairs, h.len()), h, norm_w, w, out).map_err(wrap)
            }

            fn outputs(w: &Layout) -> usize {
                let $rows = w.dims()[0];
                $outputs
            }
        }

        impl CustomOp3 for $op<'_> {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(&self, h: &CpuStorage, hl: &Layout, n: &CpuStorage, nl: &Layout, w: &CpuStorage, wl: &Layout) -> Result<(CpuStorage, Shape)> {
                let gpu = &self.kernels.gpu;
                let outputs = Self::outputs(wl);
                let mut out = gpu.upload(&vec![f32::NAN; outputs]).map_err(wrap)?;
                self.launch(&mut emulated(gpu, h, hl)?, &emulated(gpu, n, nl)?, &emulated(gpu, w, wl)?, &mut out)?;
                Ok((CpuStorage::F32(download(gpu, &out)?), Shape::from(outputs)))
            }

            #[cfg(feature = "cuda")]
            fn cuda_fwd(&self, h: &candle_core::CudaStorage, hl: &Layout, n: &candle_core::CudaStorage, nl: &Layout, w: &candle_core::CudaStorage, wl: &Layout) -> Result<(candle_core::CudaStorage, Shape)> {
                let stream = self.kernels.gpu.stream();
                let outputs = Self::outputs(wl);
                let out = cuda::alloc::<f32>(&h.device, outputs)?;
                // SAFETY: as in `Attention::cuda_fwd`.
                unsafe {
                    let (mut hb, _g1) = cuda::borrow::<f32>(stream, h, hl)?;
                    let (nb, _g2) = cuda::borrow::<bf16>(stream, n, nl)?;
                    let (wb, _g3) = cuda::borrow::<bf16>(stream, w, wl)?;
                    let (mut ob, _g4) = cuda::whole(stream, &out)?;
                    self.launch(&mut hb, &nb, &wb, &mut ob)?;
                }
                Ok((candle_core::CudaStorage::wrap_cuda_slice(out, h.device.clone()), Shape::from(outputs)))
            }
        }
    };
}

normed_projection!(GateUp, "clusterfuse-gate-up", gate_up, |rows| rows / 2, |inter| inter);
normed_projection!(LmHead, "clusterfuse-lm-head", lm_head, |rows| rows, |vocab| vocab / 2);

/// Candle's CUDA memory as clusterfuse buffers.
#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use candle_core::cuda::CudaDType;
    use candle_core::{CudaDevice, CudaStorage};
    use clusterfuse::host::cudarc::driver::{CudaSlice, CudaStream, DevicePtr, SyncOnDrop};
    use clusterfuse::host::Stream;
    use std::sync::Arc;

    /// The CUDA storage of a tensor an op takes beside its operands.
    pub fn storage(storage: &Storage) -> Result<&CudaStorage> {
        match storage {
            Storage::Cuda(cuda) => Ok(cuda),
            _ => bail!("an operand of a CUDA op is not on a CUDA device"),
        }
    }

    /// The candle stream `stream` is.
    fn cuda_stream(stream: &Stream) -> Result<&Arc<CudaStream>> {
        stream.cuda().ok_or_else(|| candle_core::Error::Msg("clusterfuse kernels loaded on the emulator got CUDA tensors".into()))
    }

    /// `len` uninitialised values on `device`, for an output the kernel writes whole.
    pub fn alloc<T: DeviceRepr>(device: &CudaDevice, len: usize) -> Result<CudaSlice<T>> {
        // SAFETY: every element is written by the op's kernel before anything reads it.
        unsafe { device.alloc::<T>(len) }
    }

    /// A tensor's contiguous part of `storage` as a buffer on `stream`, with cudarc's guard
    /// (which, where the context tracks events, records the use when dropped).
    ///
    /// # Safety
    /// 1. `stream` is the stream of `storage`'s device ([`Kernels::new`] made it so).
    /// 2. The buffer is used only while `storage` is borrowed, by launches on `stream`.
    pub unsafe fn borrow<'a, T: CudaDType + DeviceRepr + 'a>(stream: &'a Stream, storage: &'a CudaStorage, layout: &Layout) -> Result<(Buffer<T>, SyncOnDrop<'a>)> {
        let Some((start, end)) = layout.contiguous_offsets() else { bail!("clusterfuse-candle needs contiguous tensors") };
        let slice = storage.as_cuda_slice::<T>()?;
        let (address, guard) = slice.device_ptr(cuda_stream(stream)?);
        // SAFETY: the caller's guarantees; `start .. end` lies in the slice (candle's layout).
        Ok((unsafe { Buffer::from_raw(stream, address + (start * size_of::<T>()) as u64, end - start) }, guard))
    }

    /// A whole new slice as a buffer on `stream`.
    ///
    /// # Safety
    /// As for [`borrow`].
    pub unsafe fn whole<'a, T: DeviceRepr + 'a>(stream: &'a Stream, slice: &'a CudaSlice<T>) -> Result<(Buffer<T>, SyncOnDrop<'a>)> {
        let (address, guard) = slice.device_ptr(cuda_stream(stream)?);
        // SAFETY: the caller's guarantees.
        Ok((unsafe { Buffer::from_raw(stream, address, slice.len()) }, guard))
    }
}
