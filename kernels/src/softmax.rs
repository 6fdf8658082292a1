//! Row softmax with warp shuffles: one warp per row, 16-byte vector loads, the row's
//! maximum and sum combined across lanes by `warp::reduce_*`, `exp2` on the fast path.

use clusterfuse::prelude::*;
#[cfg(not(target_arch = "nvptx64"))]
use clusterfuse::host::{Buffer, Error, Result, Stream};

/// Rows a block of [`fn@softmax`] computes: a warp each.
pub const ROWS_PER_BLOCK: u32 = 8;

/// `out[r, c] = exp(x[r, c] − max_r) / Σ_c exp(x[r, c] − max_r)` for `rows × cols`, row-major;
/// `cols` must be a multiple of 4 (16-byte rows).
#[kernel(launch_bounds(max_threads = 256))]
pub fn softmax(x: &[f32], out: Out<f32>, cols: u32) {
    let row = (block::index_x() * (block::size() / 32) + warp::index_in_block()) as usize;
    let vectors = cols as usize / 4;
    if (row + 1) * cols as usize > x.len() {
        return;
    }
    let first = row * vectors;
    let lane = warp::lane() as usize;
    let mut max = f32::NEG_INFINITY;
    let mut v = lane;
    while v < vectors {
        for value in global::load16::<f32, 4>(x, first + v) {
            max = if value > max { value } else { max };
        }
        v += 32;
    }
    let max = warp::reduce_max(max);
    let scale = core::f32::consts::LOG2_E;
    let mut sum = 0.0f32;
    let mut v = lane;
    while v < vectors {
        for value in global::load16::<f32, 4>(x, first + v) {
            sum += math::exp2((value - max) * scale);
        }
        v += 32;
    }
    let inv = 1.0 / warp::reduce_sum(sum);
    let mut v = lane;
    while v < vectors {
        let values = global::load16::<f32, 4>(x, first + v);
        out.store16(first + v, values.map(|value| math::exp2((value - max) * scale) * inv));
        v += 32;
    }
}


/// The launch of [`fn@softmax`] over `rows` rows.
#[cfg(not(target_arch = "nvptx64"))]
pub fn config(rows: usize) -> LaunchConfig {
    LaunchConfig { grid: (rows as u32).div_ceil(ROWS_PER_BLOCK).into(), block: (ROWS_PER_BLOCK * 32).into(), ..LaunchConfig::default() }
}

/// `out = softmax(x)` over each row of a `rows × cols` f32 matrix (row-major) on `stream`,
/// or [`Error::UnsupportedShape`] where `cols` is not a positive multiple of 4 or a buffer
/// holds fewer than `rows × cols` values.
///
/// ```no_run
/// # fn main() -> clusterfuse::host::Result<()> {
/// use clusterfuse::host::Gpu;
/// use clusterfuse_kernels::softmax;
///
/// let gpu = Gpu::new(0)?;
/// let x = gpu.upload(&vec![0.5f32; 64 * 1000])?;
/// let mut out = gpu.zeros::<f32>(64 * 1000)?;
/// softmax::launch(&softmax::softmax::load(&gpu)?, gpu.stream(), &x, &mut out, 64, 1000)?;
/// # Ok(()) }
/// ```
#[cfg(not(target_arch = "nvptx64"))]
pub fn launch(kernel: &softmax::Kernel, stream: &Stream, x: &Buffer<f32>, out: &mut Buffer<f32>, rows: usize, cols: usize) -> Result<()> {
    let unsupported = |reason: String| Err(Error::UnsupportedShape { kernel: "softmax", reason });
    if cols == 0 || !cols.is_multiple_of(4) || cols > u32::MAX as usize {
        return unsupported(format!("{cols} columns: a row must be a positive multiple of 4 values (16-byte vectors)"));
    }
    if x.len() < rows * cols || out.len() < rows * cols {
        return unsupported(format!("{rows} × {cols} needs {} values; x holds {}, out {}", rows * cols, x.len(), out.len()));
    }
    kernel.launch(stream, &config(rows), x, out, cols as u32)
}
