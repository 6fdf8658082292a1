//! Runs the kernel on the GPU (or, without one, on clusterfuse's CPU emulator) against an f64
//! reference, on fresh inputs, with the output poisoned first.

use clusterfuse::host::{Gpu, Result};
use my_kernels::rms_norm_residual;

fn main() -> Result<()> {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(err) => {
            eprintln!("no GPU ({err}): running on the CPU emulator");
            Gpu::emulator()
        }
    };
    let (rows, cols) = (64, 1000);
    let mut seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    let mut random = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                // xorshift64*: enough for test inputs.
                seed ^= seed >> 12;
                seed ^= seed << 25;
                seed ^= seed >> 27;
                (seed.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    };
    let (x, w, residual) = (random(rows * cols), random(cols), random(rows * cols));

    let kernel = rms_norm_residual::load(&gpu)?;
    let (dx, dw, dr) = (gpu.upload(&x)?, gpu.upload(&w)?, gpu.upload(&residual)?);
    let mut out = gpu.upload(&vec![f32::NAN; rows * cols])?;
    let config = rms_norm_residual::config(rows as u32);
    kernel.launch(gpu.stream(), &config, &dx, &dw, &dr, &mut out, cols as u32, rows as u32)?;
    let out = gpu.download(&out)?;

    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (r, row) in x.chunks(cols).enumerate() {
        let rms = (row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / cols as f64 + 1e-5).sqrt();
        for (c, &v) in row.iter().enumerate() {
            let expected = v as f64 / rms * w[c] as f64 + residual[r * cols + c] as f64;
            diff += (out[r * cols + c] as f64 - expected).powi(2);
            norm += expected * expected;
        }
    }
    let error = (diff / norm).sqrt();
    println!("{}: rms_norm_residual, {rows} × {cols}: relative error {error:.2e}", gpu.name().unwrap_or_default());
    assert!(error < 1e-5, "relative error {error:.2e} is above 1e-5");
    Ok(())
}
