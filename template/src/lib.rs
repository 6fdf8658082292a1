//! A kernel crate: `cargo build` compiles the kernels below to PTX and gives the host a typed
//! launcher for each.

use clusterfuse::prelude::*;

clusterfuse::embed_ptx!();

/// RMSNorm of each row scaled by `w`, then `+ residual`: three stages, one kernel. A block of
/// 256 threads per row; each thread keeps its values of the row in registers between stages.
#[fused_kernel(grid = rows, block = 256, launch_bounds(max_threads = 256))]
pub mod rms_norm_residual {
    use clusterfuse::prelude::*;

    /// Threads per block, as `block = 256` above.
    pub const THREADS: usize = 256;
    /// Values per thread, at most: rows of up to 256 × 8 = 2048 values.
    pub const PER_THREAD: usize = 8;

    /// The row's values this thread owns (columns `t`, `t + 256`, ..), zero past the row.
    #[derive(Clone, Copy)]
    pub struct Row(pub [f32; PER_THREAD]);

    #[stage(thread)]
    fn fetch(x: Global<&[f32]>, cols: u32) -> Registers<Row> {
        if cols as usize > THREADS * PER_THREAD {
            // A row longer than the block holds: fail loudly rather than drop values.
            clusterfuse::arch::trap();
        }
        let start = block::index_x() as usize * cols as usize;
        let mut row = [0.0; PER_THREAD];
        for (j, v) in row.iter_mut().enumerate() {
            let c = thread::index_x() as usize + j * THREADS;
            if c < cols as usize {
                *v = x[start + c];
            }
        }
        Row(row)
    }

    /// 1 / √(mean of squares + ε), the same in every thread of the block.
    #[stage(block)]
    fn inverse_rms(row: Registers<Row>, cols: u32) -> Registers<f32> {
        let squares = row.0.iter().fold(0.0f32, |s, v| v.fma(*v, s));
        let total = block::reduce_sum(squares, shared!([f32; 32]));
        math::rsqrt(total / cols as f32 + 1e-5)
    }

    #[stage(thread)]
    fn store(row: Registers<Row>, scale: Registers<f32>, w: Global<&[f32]>, residual: Global<&[f32]>, out: Global<Out<f32>>, cols: u32) {
        let start = block::index_x() as usize * cols as usize;
        for (j, v) in row.0.iter().enumerate() {
            let c = thread::index_x() as usize + j * THREADS;
            if c < cols as usize {
                out.set(start + c, (v * scale).fma(w[c], residual[start + c]));
            }
        }
    }

    pub fn kernel(x: &[f32], w: &[f32], residual: &[f32], out: Out<f32>, cols: u32, rows: u32) {
        let row = fetch(x, cols);
        let scale = inverse_rms(row, cols);
        store(row, scale, w, residual, out, cols);
    }
}
