//! What every example's check shares: fresh random inputs, poisoned outputs, and the
//! relative error against an f64 reference.

use clusterfuse::host::{Gpu, Result};
use rand::Rng;

/// Runs one example on the GPU and reports how it compared with its reference.
pub type Runner = fn(&Gpu) -> Result<Report>;

/// One example's outcome.
#[derive(Debug)]
pub struct Report {
    /// What was run, e.g. "n = 1048576".
    pub shape: String,
    /// ‖out − ref‖₂ / ‖ref‖₂.
    pub rel_error: f64,
    /// The bound it must stay under.
    pub tolerance: f64,
    /// Outputs still holding the poison (never written), or NaN.
    pub unwritten: usize,
}

impl Report {
    /// Compares `out` with `reference`.
    pub fn new(shape: String, out: &[f32], reference: &[f64], tolerance: f64) -> Self {
        assert_eq!(out.len(), reference.len(), "output and reference lengths differ");
        let unwritten = out.iter().filter(|v| v.is_nan()).count();
        let (mut diff, mut norm) = (0.0, 0.0);
        for (&o, &r) in out.iter().zip(reference) {
            diff += (o as f64 - r).powi(2);
            norm += r * r;
        }
        let rel_error = if norm == 0.0 { diff.sqrt() } else { (diff / norm).sqrt() };
        Self { shape, rel_error, tolerance, unwritten }
    }

    /// True when every output was written and the error is within tolerance.
    pub fn passed(&self) -> bool {
        self.unwritten == 0 && self.rel_error <= self.tolerance
    }
}

/// `len` values drawn uniformly from `[-1, 1)`, fresh each call.
pub fn random(len: usize) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..len).map(|_| rng.random_range(-1.0..1.0)).collect()
}

/// A device buffer of `len` NaNs: outputs start poisoned so that unwritten elements show.
pub fn poisoned(gpu: &Gpu, len: usize) -> Result<clusterfuse::host::CudaSlice<f32>> {
    gpu.upload(&vec![f32::NAN; len])
}
