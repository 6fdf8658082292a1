//! 10 — a GEMM on the tensor cores: the kernel library's [`clusterfuse_kernels::gemm`]
//! (`C = epilogue(A·B)`, f16 or bf16, `mma.sync` from a `cp.async` pipeline, split-K over a
//! cluster for small M; its docs describe the kernel), checked against f64 at shapes off the
//! tile sizes with each of its five epilogues; and [`fn@mma_tile`], one warp's 16 × 16 × 16
//! product through each fragment loader of [`clusterfuse::mma`].

use clusterfuse::mma::{mma_m16n8k16, FragA, FragB, FragC};
use clusterfuse::prelude::*;

/// One warp, one 16 × 16 × 16 product two ways, to check the fragment loaders: with A
/// (16 × 16), B (16 × 16, k × n), its transpose Bᵀ and C (16 × 16, f32) row-major,
/// `out[..256] = A·B + C` through `FragA::load` and `FragB::load_pair_k_major`, and
/// `out[256..]` the same through `FragB::load_k_major` (columns 0-7) and
/// `FragB::load_n_major` on Bᵀ (columns 8-15).
#[kernel(launch_bounds(max_threads = 32))]
pub fn mma_tile(a: &[bf16], b: &[bf16], bt: &[bf16], c: &[f32], out: Out<f32>) {
    let (sa, sb, sbt) = (shared!([bf16; 256]), shared!([bf16; 256]), shared!([bf16; 256]));
    for i in (warp::lane() as usize..256).step_by(32) {
        sa.store(i, a[i]);
        sb.store(i, b[i]);
        sbt.store(i, bt[i]);
    }
    warp::sync();
    let frag_a = FragA::load(sa, 16, 0, 0);
    let ways = [FragB::load_pair_k_major(sb, 16, 0, 0), [FragB::load_k_major(sb, 16, 0, 0), FragB::load_n_major(sbt, 16, 8, 0)]];
    for (way, frags) in ways.iter().enumerate() {
        for (j, &frag_b) in frags.iter().enumerate() {
            let mut acc = FragC::ZERO;
            for (v, value) in acc.values.iter_mut().enumerate() {
                let (r, col) = FragC::position(v);
                *value = c[r * 16 + j * 8 + col];
            }
            let d = mma_m16n8k16(frag_a, frag_b, acc);
            for (v, &value) in d.values.iter().enumerate() {
                let (r, col) = FragC::position(v);
                out.set(way * 256 + r * 16 + j * 8 + col, value);
            }
        }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::*;
    use crate::check::{poisoned, random, shape, with_rng, Report};
    use clusterfuse::host::Result;
    use clusterfuse_kernels::gemm::{config, EpilogueKind, GemmError, GemmType, HostOperands, Operands, BF16_TOLERANCE, F16_TOLERANCE};
    use rand::Rng;

    /// Checks one kind against its f64 reference, on every output of two GEMMs: M, N, K off
    /// the tile sizes (on the emulator: two row tiles, the second 22 rows; two column tiles,
    /// the second 8 columns; four k-steps, the last 8 deep), split along K over a cluster
    /// ([`split_k`](clusterfuse_kernels::gemm::split_k)), and the same M, N with K = 40 (one k-step, no split).
    pub fn run<T: GemmType>(gpu: &Gpu, epilogue: EpilogueKind, tolerance: f64) -> Result<Report> {
        let (m, n, k) = shape(gpu, (1000, 1032, 1048), (150, 136, 200));
        let kernels = T::load(gpu)?;
        let (mut outs, mut references, mut shapes) = (Vec::new(), Vec::new(), Vec::new());
        for k in [k, 40] {
            let host = with_rng(|rng| HostOperands::<T>::random(rng, m, n, k));
            let x = Operands::upload(gpu, &host)?;
            let mut out = gpu.upload(&vec![T::from_f32(f32::NAN); m * n])?;
            let splits = config(m, n, k).expect("the example's shapes are supported").grid.z;
            T::launch(&kernels, gpu, epilogue, &x, &mut out, m, n, k).map_err(|err| match err {
                GemmError::Launch(err) => err,
                GemmError::Shape(what) => unreachable!("the example's shapes are supported: {what}"),
            })?;
            outs.extend(gpu.download(&out)?.into_iter().map(HalfFloat::to_f32));
            references.extend((0..m * n).map(|i| epilogue.reference(host.dot(i / n, i % n, n, k), i / n, i % n, n, &host)));
            shapes.push(format!("{m} × {n} × {k} (split {splits})"));
        }
        Ok(Report::new(format!("{}, {}, {}", shapes.join(" and "), T::NAME, epilogue.name()), &outs, &references, tolerance))
    }


    /// Checks [`fn@mma_tile`]: both ways against the f64 product, to f32 accumulation accuracy.
    pub fn run_tile(gpu: &Gpu) -> Result<Report> {
        let (a, b) = with_rng(|rng| {
            let mut values = || (0..256).map(|_| bf16::from_f32(rng.random_range(-1.0..1.0))).collect::<Vec<bf16>>();
            (values(), values())
        });
        let bt: Vec<bf16> = (0..256).map(|i| b[i % 16 * 16 + i / 16]).collect();
        let c = random(256);
        let reference: Vec<f64> = (0..512)
            .map(|i| {
                let (r, col) = (i % 256 / 16, i % 16);
                c[i % 256] as f64 + (0..16).map(|k| a[r * 16 + k].to_f64() * b[k * 16 + col].to_f64()).sum::<f64>()
            })
            .collect();
        let (da, db, dbt, dc) = (gpu.upload(&a)?, gpu.upload(&b)?, gpu.upload(&bt)?, gpu.upload(&c)?);
        let mut out = poisoned(gpu, 512)?;
        let config = LaunchConfig { grid: 1.into(), block: 32.into(), ..LaunchConfig::default() };
        mma_tile::load(gpu)?.launch(gpu.stream(), &config, &da, &db, &dbt, &dc, &mut out)?;
        Ok(Report::new("16 × 16 × 16, bf16, two ways".into(), &gpu.download(&out)?, &reference, 1e-6))
    }

    macro_rules! runners {
        ($($name:ident => $t:ident, $kind:ident, $tolerance:ident;)*) => {$(
            #[doc = concat!("Example runner: ", stringify!($t), ", epilogue ", stringify!($kind), ".")]
            pub fn $name(gpu: &Gpu) -> Result<Report> {
                run::<$t>(gpu, EpilogueKind::$kind, $tolerance)
            }
        )*};
    }

    runners! {
        f16_plain => f16, None, F16_TOLERANCE;
        f16_bias => f16, Bias, F16_TOLERANCE;
        f16_bias_gelu => f16, BiasGelu, F16_TOLERANCE;
        f16_residual => f16, Residual, F16_TOLERANCE;
        f16_scale => f16, Scale, F16_TOLERANCE;
        bf16_plain => bf16, None, BF16_TOLERANCE;
        bf16_bias => bf16, Bias, BF16_TOLERANCE;
        bf16_bias_gelu => bf16, BiasGelu, BF16_TOLERANCE;
        bf16_residual => bf16, Residual, BF16_TOLERANCE;
        bf16_scale => bf16, Scale, BF16_TOLERANCE;
    }
}
