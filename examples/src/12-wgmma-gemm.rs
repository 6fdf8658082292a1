//! 12 — a GEMM on Hopper's warpgroup tensor cores: the kernel library's
//! [`clusterfuse_kernels::wgmma_gemm`] (`C = epilogue(A·Bᵀ)`, bf16 or f16, a persistent
//! TMA + `wgmma` pipeline with a producer warpgroup and two consumers; split-K over a cluster
//! with partial tiles summed over DSMEM, and a LayerNorm deferred into the next GEMM; its docs
//! describe the kernels), checked against f64 with each epilogue; and [`fn@tma_box`], one TMA
//! load, to check the 128-byte swizzle.

use clusterfuse::arch;
use clusterfuse::prelude::*;
use clusterfuse::tma::TensorMap;

/// One TMA load, to check the 128-byte swizzle: the 8 × 64 bf16 box at (column `c0`, row
/// `c1`) of the tensor `map` describes, written to `out` (512 values) un-swizzled, zeros where
/// the box leaves the tensor. With `waited == 0` the threads read the tile without waiting for
/// its mbarrier (a race, which the emulator reports).
#[kernel(launch_bounds(max_threads = 128))]
pub fn tma_box(map: &[u64], out: Out<bf16>, c0: i32, c1: i32, waited: u32) {
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let (tile, slot) = (smem.take::<bf16>(8 * 64), smem.take::<u64>(1));
    // SAFETY: its own shared word, and the block barrier right after.
    let mut barrier = unsafe { clusterfuse::mbarrier::Mbarrier::new(slot, 1) };
    block::sync();
    let t = thread::index_x() as usize;
    if t == 0 {
        barrier.arrive_expect_tx(1024);
        // SAFETY: the tile is 1024-aligned, holds the box, and is read only after the wait;
        // the barrier's phase expects the box's 1024 bytes.
        unsafe { TensorMap::new(map).load_2d(tile.addr(), c0, c1, barrier.addr()) };
    }
    if waited != 0 {
        barrier.wait();
    }
    unswizzle_box(tile, &out, t);
}

/// Thread `t` of 128's share of the 8 × 64 bf16 box in `tile`, as a 128-byte-swizzled TMA
/// load left it, written to `out` un-swizzled.
#[inline(always)]
fn unswizzle_box(tile: SharedSlice<bf16>, out: &Out<bf16>, t: usize) {
    for i in (t..512).step_by(128) {
        // Row r's 16-byte chunk j sits at chunk j ^ (r % 8) of the row.
        let (r, c) = (i / 64, i % 64);
        out.set(i, tile.load(r * 64 + ((c / 8) ^ (r % 8)) * 8 + c % 8));
    }
}

/// As [`fn@tma_box`], the box loaded by the cluster's first block into the second's shared
/// memory (a `.shared::cluster` destination and mbarrier, from `mapa`), which the second
/// reads back into `out`: the emulator's test of TMA loads into a peer (on the H200 it
/// matched the emulator bitwise and memcheck found nothing; racecheck's tool fails on it,
/// as on other asynchronous copies into a peer, so no example runs it).
#[kernel(launch_bounds(max_threads = 128), cluster(2, 1, 1))]
pub fn tma_box_peer(map: &[u64], out: Out<bf16>, c0: i32, c1: i32) {
    let mut smem = shared::dynamic();
    smem.align_to(1024);
    let (tile, slot) = (smem.take::<bf16>(8 * 64), smem.take::<u64>(1));
    // SAFETY: its own shared word; thread 0 (which initialised it) expects before the cluster
    // barrier below, every other use comes after it.
    let mut barrier = unsafe { clusterfuse::mbarrier::Mbarrier::new(slot, 1) };
    let (rank, t) = (cluster::block_rank(), thread::index_x() as usize);
    if rank == 1 && t == 0 {
        barrier.arrive_expect_tx(1024);
    }
    // The second block's barrier is initialised and expects the box before the load starts.
    cluster::sync();
    if rank == 0 && t == 0 {
        let (dst, full) = (arch::mapa_shared_cluster(tile.addr(), 1), arch::mapa_shared_cluster(barrier.addr(), 1));
        // SAFETY: the second block's tile is 1024-aligned and holds the box, read there only
        // after its barrier's phase, which expects the box's 1024 bytes, completes.
        unsafe { TensorMap::new(map).load_2d(dst, c0, c1, full) };
    }
    if rank == 1 {
        barrier.wait();
        unswizzle_box(tile, &out, t);
    }
    // The first block stays until the second has its box.
    cluster::sync();
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::*;
    use crate::check::{planned_layout, random, shape, with_rng, Report};
    use clusterfuse::host::{Result, Swizzle};
    use clusterfuse_kernels::gemm::{EpilogueKind, GemmError, HostOperands, Operands, BF16_TOLERANCE, F16_TOLERANCE};
    use clusterfuse_kernels::norms::EPS;
    use clusterfuse_kernels::wgmma_gemm::*;

    /// Checks one epilogue against its f64 reference, on every output: M, N off the tile
    /// sizes and K off the k-step (on the emulator: two blocks, two tiles each; two row tiles,
    /// the second 22 rows; two column tiles, the second 7 columns for bf16 (N odd, so that the
    /// stores go one at a time) and 8 for f16 (N even: the first tile takes the unchecked
    /// path, the others the checked one, paired); six k-steps, the last 8 deep, so that the
    /// four-stage pipeline wraps; on a GPU N is even and the stores are paired).
    pub fn run<T: WgmmaType>(gpu: &Gpu, epilogue: EpilogueKind, tolerance: f64) -> Result<Report> {
        let odd = usize::from(T::NAME == "bf16");
        let (m, n, k) = shape(gpu, (1000, 1032, 1048), (150, 264 - odd, 328));
        let host = with_rng(|rng| HostOperands::<T>::random(rng, m, n, k));
        let x = Operands::upload(gpu, &host)?;
        let bt = gpu.upload(&transpose(&host.b, k, n))?;
        let mut out = gpu.upload(&vec![T::from_f32(f32::NAN); m * n])?;
        let kernels = Kernels::<T>::load(gpu)?;
        let unsupported = |err: GemmError| match err {
            GemmError::Launch(err) => err,
            GemmError::Shape(what) => unreachable!("the example's shapes are supported: {what}"),
        };
        let maps = Maps::new(gpu, &x.a, &bt, (m, n, k)).map_err(unsupported)?;
        kernels.launch(gpu, epilogue, &maps, &x, &mut out, (m, n, k)).map_err(unsupported)?;
        let out: Vec<f32> = gpu.download(&out)?.into_iter().map(HalfFloat::to_f32).collect();
        let reference: Vec<f64> =
            (0..m * n).map(|i| epilogue.reference(host.dot(i / n, i % n, n, k), i / n, i % n, n, &host)).collect();
        Ok(Report::new(format!("{m} × {n} × {k}, {}, {}", T::NAME, epilogue.name()), &out, &reference, tolerance))
    }

    /// The SMs the emulator stands for in [`run_split_k`] (and a GPU running its shapes), so
    /// that its 2 tiles split K three ways, 5-6 k-steps a block: blocks of 5 and 6 stages
    /// in one cluster ([`run_split_k_layer_norm`]'s second GEMM, 10 k-steps, wraps the pipeline).
    const EMULATOR_SPLIT_SMS: usize = 6;

    /// Checks one epilogue of the f16 split-K kernels against its f64 reference, on every
    /// output: on a GPU BERT-base's FFN2 at batch 1 (128 × 768 × 3072, 12 tiles × 8 blocks);
    /// on the emulator M = 100 (one partial row tile), N = 72 (the second column tile 8 wide),
    /// K = 1048 (17 k-steps, the last 24 deep) over 3 blocks.
    pub fn run_split_k(gpu: &Gpu, epilogue: EpilogueKind) -> Result<Report> {
        let (m, n, k) = shape(gpu, (128, 768, 3072), (100, 72, 1048));
        let layout = planned_layout(gpu, EMULATOR_SPLIT_SMS)?;
        let host = with_rng(|rng| HostOperands::<f16>::random(rng, m, n, k));
        let x = Operands::upload(gpu, &host)?;
        let bt = gpu.upload(&transpose(&host.b, k, n))?;
        let mut out = gpu.upload(&vec![f16::NAN; m * n])?;
        let unsupported = |err: GemmError| match err {
            GemmError::Launch(err) => err,
            GemmError::Shape(what) => unreachable!("the example's shapes are supported: {what}"),
        };
        let config = split_k_config(m, n, k, &layout, MAX_SPLITS).map_err(unsupported)?;
        let (a_map, b_map) = (a_map(gpu, &x.a, (m, k))?, split_bt_map(gpu, &bt, (n, k))?);
        let (s, a, b, (mu, nu, ku)) = (gpu.stream(), a_map.words(), b_map.words(), (m as u32, n as u32, k as u32));
        match epilogue {
            EpilogueKind::None => wgmma_split_f16::load(gpu)?.launch(s, &config, a, b, &mut out, mu, nu, ku)?,
            EpilogueKind::Bias => wgmma_split_f16_bias::load(gpu)?.launch(s, &config, a, b, &x.bias, &mut out, mu, nu, ku)?,
            EpilogueKind::BiasGelu => wgmma_split_f16_bias_gelu::load(gpu)?.launch(s, &config, a, b, &x.bias, &mut out, mu, nu, ku)?,
            EpilogueKind::Residual => wgmma_split_f16_residual::load(gpu)?.launch(s, &config, a, b, &x.residual, &mut out, mu, nu, ku)?,
            EpilogueKind::Scale => unreachable!("the split-K kernels have no scaling epilogue"),
        }
        let out: Vec<f32> = gpu.download(&out)?.into_iter().map(HalfFloat::to_f32).collect();
        let reference: Vec<f64> =
            (0..m * n).map(|i| epilogue.reference(host.dot(i / n, i % n, n, k), i / n, i % n, n, &host)).collect();
        let shape = format!("{m} × {n} × {k}, f16, {}, split K over {}", epilogue.name(), config.grid.z);
        Ok(Report::new(shape, &out, &reference, F16_TOLERANCE))
    }

    /// Checks the deferred LayerNorm of the split-K kernels end to end against its f64
    /// reference: `s = a · w₀ + b₀ + r` with its rows' statistics
    /// ([`fn@wgmma_split_f16_residual_stats`]), then `out = LayerNorm(s) · w₁ + b₁` with the
    /// LayerNorm folded into the product ([`fn@wgmma_split_f16_folded_ln_bias`]). On a GPU
    /// BERT-base's O and FFN1 shapes at batch 1 (128 rows, hidden 768, FFN 3072: 12 tiles × 6
    /// blocks, then 48 × 2); on the emulator 100 rows (one partial row tile), hidden 640, 128
    /// outputs, the second product on one block a tile (10 k-steps: the pipeline wraps).
    pub fn run_split_k_layer_norm(gpu: &Gpu) -> Result<Report> {
        let (m, h, k0, n) = shape(gpu, (128, 768, 768, 3072), (100, 640, 192, 128));
        let layout = planned_layout(gpu, 2)?;
        let f16s = |len: usize, scale: f32| -> Vec<f16> { random(len).into_iter().map(|v| f16::from_f32(scale * v)).collect() };
        // Weights as example 10 takes them (K × N).
        let (a, w0, b0, r) = (f16s(m * k0, 1.0), f16s(k0 * h, 1.0 / (k0 as f32).sqrt()), f16s(h, 1.0), f16s(m * h, 1.0));
        let (gamma, beta, w1, b1) = (f16s(h, 1.0), f16s(h, 1.0), f16s(h * n, 1.0 / (h as f32).sqrt()), f16s(n, 1.0));
        let (w1_folded, c, d) = fold_layer_norm(&w1, (h, n), &b1, &gamma, &beta);
        let unsupported = |err: GemmError| match err {
            GemmError::Launch(err) => err,
            GemmError::Shape(what) => unreachable!("the example's shapes are supported: {what}"),
        };
        let (first, second) = (split_k_config(m, h, k0, &layout, MAX_SPLITS).map_err(unsupported)?, split_k_config(m, n, h, &layout, MAX_SPLITS).map_err(unsupported)?);
        let (a_d, b0_d, r_d) = (gpu.upload(&a)?, gpu.upload(&b0)?, gpu.upload(&r)?);
        let (w0t, w1t, c_d, d_d) = (gpu.upload(&transpose(&w0, k0, h))?, gpu.upload(&transpose(&w1_folded, h, n))?, gpu.upload(&c)?, gpu.upload(&d)?);
        let (mut summed, mut out) = (gpu.upload(&vec![f16::NAN; m * h])?, gpu.upload(&vec![f16::NAN; m * n])?);
        let mut stats = gpu.upload(&vec![f32::NAN; 2 * m * (h / SPLIT_BN)])?;
        let (s, (mu, hu, k0u, nu)) = (gpu.stream(), (m as u32, h as u32, k0 as u32, n as u32));
        let (a_m, w0_m, w1_m) = (a_map(gpu, &a_d, (m, k0))?, split_bt_map(gpu, &w0t, (h, k0))?, split_bt_map(gpu, &w1t, (n, h))?);
        wgmma_split_f16_residual_stats::load(gpu)?.launch(s, &first, a_m.words(), w0_m.words(), &b0_d, &r_d, &mut summed, &mut stats, mu, hu, k0u)?;
        let summed_m = a_map(gpu, &summed, (m, h))?;
        let folded = wgmma_split_f16_folded_ln_bias::load(gpu)?;
        folded.launch(s, &second, summed_m.words(), w1_m.words(), &stats, &c_d, &d_d, &mut out, mu, nu, hu)?;
        let out: Vec<f32> = gpu.download(&out)?.into_iter().map(HalfFloat::to_f32).collect();
        let f = |x: &[f16], i: usize| x[i].to_f64();
        let mut reference = Vec::with_capacity(m * n);
        for i in 0..m {
            // The LayerNorm's input as the first kernel stores it: rounded to f16.
            let s: Vec<f64> =
                (0..h).map(|j| f16::from_f32(((0..k0).map(|e| f(&a, i * k0 + e) * f(&w0, e * h + j)).sum::<f64>() + f(&b0, j) + f(&r, i * h + j)) as f32).to_f64()).collect();
            let mean = s.iter().sum::<f64>() / h as f64;
            let rstd = 1.0 / (s.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / h as f64 + EPS as f64).sqrt();
            let normed: Vec<f64> = (0..h).map(|j| (s[j] - mean) * rstd * f(&gamma, j) + f(&beta, j)).collect();
            reference.extend((0..n).map(|j| (0..h).map(|e| normed[e] * f(&w1, e * n + j)).sum::<f64>() + f(&b1, j)));
        }
        let shape = format!("{m} × {h} × {k0} with row statistics, then LayerNorm → {m} × {n} × {h}, f16, split K over {} and {}", first.grid.z, second.grid.z);
        Ok(Report::new(shape, &out, &reference, LAYER_NORM_TOLERANCE))
    }

    /// Relative error allowed of [`run_split_k_layer_norm`]: W′ = diag(γ)·W rounded to f16
    /// (2^-11 of each weight) on top of the split-K product's.
    pub const LAYER_NORM_TOLERANCE: f64 = 2e-3;

    /// Dynamic shared memory of [`fn@tma_box`]: the tile, its barrier, and room to align them.
    pub const TMA_BOX_SMEM: u32 = 3072;

    /// Checks [`fn@tma_box`] on a 20 × 72 tensor, the box at (40, 16): 4 of its rows and 32 of its
    /// columns inside, the rest zero-filled.
    pub fn run_tma_box(gpu: &Gpu) -> Result<Report> {
        let (rows, cols, c0, c1) = (20, 72, 40, 16);
        let x: Vec<bf16> = random(rows * cols).into_iter().map(bf16::from_f32).collect();
        let reference: Vec<f64> = (0..512)
            .map(|i| {
                let (r, c) = (c1 + i / 64, c0 + i % 64);
                if r < rows && c < cols { x[r * cols + c].to_f64() } else { 0.0 }
            })
            .collect();
        let tensor = gpu.upload(&x)?;
        let map = gpu.tensor_map_2d(&tensor, (rows, cols), (8, 64), Swizzle::B128)?;
        let mut out = gpu.upload(&[bf16::NAN; 512])?;
        let config = LaunchConfig { grid: 1.into(), block: 128.into(), dynamic_smem_bytes: TMA_BOX_SMEM, ..LaunchConfig::default() };
        tma_box::load(gpu)?.launch(gpu.stream(), &config, map.words(), &mut out, c0 as i32, c1 as i32, 1)?;
        let out: Vec<f32> = gpu.download(&out)?.into_iter().map(HalfFloat::to_f32).collect();
        Ok(Report::new("8 × 64 box at (40, 16) of 20 × 72, bf16, 128-byte swizzle".into(), &out, &reference, 0.0))
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
        plain => bf16, None, BF16_TOLERANCE;
        bias => bf16, Bias, BF16_TOLERANCE;
        bias_gelu => bf16, BiasGelu, BF16_TOLERANCE;
        residual => bf16, Residual, BF16_TOLERANCE;
        scale => bf16, Scale, BF16_TOLERANCE;
        f16_plain => f16, None, F16_TOLERANCE;
        f16_bias => f16, Bias, F16_TOLERANCE;
        f16_bias_gelu => f16, BiasGelu, F16_TOLERANCE;
        f16_residual => f16, Residual, F16_TOLERANCE;
        f16_scale => f16, Scale, F16_TOLERANCE;
    }

    macro_rules! split_runners {
        ($($name:ident => $kind:ident;)*) => {$(
            #[doc = concat!("Example runner: the f16 split-K kernel, epilogue ", stringify!($kind), ".")]
            pub fn $name(gpu: &Gpu) -> Result<Report> {
                run_split_k(gpu, EpilogueKind::$kind)
            }
        )*};
    }

    split_runners! {
        split_f16_plain => None;
        split_f16_bias => Bias;
        split_f16_bias_gelu => BiasGelu;
        split_f16_residual => Residual;
    }
}
