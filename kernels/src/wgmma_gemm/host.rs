//! The `wgmma` GEMMs on the host: launch shapes (split-K by the SM layout), tensor maps, the
//! launches, LayerNorm folded into a projection's weights.

use super::*;
use crate::gemm::{EpilogueKind, GemmError, Operands};
use clusterfuse::host::cudarc::driver::DeviceRepr;
use clusterfuse::host::{Buffer, Result, Swizzle, TensorMap, TmaElement};
use clusterfuse::Dim3;

/// The launch configuration of an M × N × K GEMM on at most `blocks` blocks (the SMs), or
/// why the kernels cannot compute it.
pub fn config(m: usize, n: usize, k: usize, blocks: usize) -> std::result::Result<LaunchConfig, GemmError> {
    let reject = |what: String| Err(GemmError::Shape(format!("M = {m}, N = {n}, K = {k}: {what}")));
    if m == 0 || n == 0 || k == 0 {
        return reject("every dimension must be at least 1".into());
    }
    if !k.is_multiple_of(8) {
        return reject("K must be a multiple of 8 (TMA loads rows of A and Bᵀ in multiples of 16 bytes); pad it".into());
    }
    if m * k > i32::MAX as usize || k * n > i32::MAX as usize || m * n > u32::MAX as usize {
        return reject("too large: at most 2^31 elements in A and Bᵀ, 2^32 in C".into());
    }
    let tiles = m.div_ceil(BM) * n.div_ceil(BN);
    Ok(LaunchConfig {
        grid: (tiles.min(blocks.max(1)) as u32).into(),
        block: (THREADS as u32).into(),
        dynamic_smem_bytes: SMEM_BYTES,
        ..LaunchConfig::default()
    })
}

/// The launch configuration of the split-K kernels ([`gemm_split_k`]) for an M × N × K
/// GEMM on a GPU of `layout`, or why they cannot compute it: per 128 × 64 tile of C, the
/// blocks (a cluster along z, up to `max_splits`, itself at most [`MAX_SPLITS`], at most one
/// per k-step) that [`split_k_time`] puts fastest, the fewest on a tie, with the stages the
/// longest block's k-steps fill ([`split_smem_bytes`]). At most two blocks on an SM by shared
/// memory; the kernels BERT's batch-1 pass takes after its first (106-107 registers a
/// thread) fit one by registers (`tests/ptx.rs` checks it), which leaves room beside each
/// for a block of the kernel launched after it (its attention), but none for the next
/// projection's: two projection blocks side by side, as when 4 stages (99 KB) and 80
/// registers let them, ran the pass at 1.2-1.7× the time (`results/bert-h200.md`).
/// BERT-base at batch 1 on 132 SMs, at most 6 splits (`bert::SPLIT_K_SPLITS`): QKV 36
/// tiles × 3 (4 stages), O 12 × 6 (2), FFN1 48 × 2 (6), FFN2 12 × 6 (6, 8 k-steps); at
/// batch 2 O and FFN2 24 × 4 (24 clusters of 5 would take two waves); at batch 16 FFN2
/// 192 × 2, two blocks a tile in three waves rather than one in two.
pub fn split_k_config(m: usize, n: usize, k: usize, layout: &SmLayout, max_splits: usize) -> std::result::Result<LaunchConfig, GemmError> {
    config(m, n, k, 1)?;
    let (tiles_n, tiles_m) = (n.div_ceil(SPLIT_BN), m.div_ceil(BM));
    if tiles_m > 65535 {
        return Err(GemmError::Shape(format!("M = {m}, N = {n}, K = {k}: at most 65535 row tiles of {BM}")));
    }
    if max_splits == 0 {
        return Err(GemmError::Shape(format!("M = {m}, N = {n}, K = {k}: max_splits is 0; a tile takes at least one block")));
    }
    let steps = k.div_ceil(BK);
    let splits = (1..=max_splits.min(MAX_SPLITS).min(steps)).min_by_key(|&s| split_k_time(tiles_n * tiles_m, steps, s, layout.clusters(s))).unwrap_or(1) as u32;
    Ok(LaunchConfig {
        grid: Dim3::new(tiles_n as u32, tiles_m as u32, splits),
        block: (THREADS as u32).into(),
        cluster: Some(Dim3::new(1, 1, splits)),
        dynamic_smem_bytes: split_smem_bytes(steps.div_ceil(splits as usize)),
        max_blocks_per_sm: Some(2),
        ..LaunchConfig::default()
    })
}

/// A split-K block's fixed cost, in k-steps: waiting for the previous kernel, the first
/// stage's loads, the cluster's DSMEM reduction and the epilogue. Fitted to the H200 in
/// BERT-base's passes (`results/bert-h200.md`, session 20): with the H200's cluster slots
/// it keeps the split counts measured best at batch 1 (QKV 3, O 6, FFN1 2, FFN2 6;
/// session 18) and those of batch 4 and 8, and gains at batch 2 (O and FFN2 4: the pass
/// 514-515 µs against 639-640 at 5, whose clusters took two waves) and 16 (FFN2 split over
/// two in three waves: 1700-1709 µs against 1744-1748 unsplit in two).
const SPLIT_BLOCK_STEPS: usize = 6;

/// The time of `tiles` tiles of `steps` k-steps, each split over a cluster of `splits`
/// blocks, `clusters` of which fit the GPU at once, in k-steps: the waves of clusters
/// times a block's fixed cost ([`SPLIT_BLOCK_STEPS`]) and its longest share of the
/// k-steps; `usize::MAX` where no such cluster fits.
fn split_k_time(tiles: usize, steps: usize, splits: usize, clusters: usize) -> usize {
    match clusters {
        0 => usize::MAX,
        _ => tiles.div_ceil(clusters) * (SPLIT_BLOCK_STEPS + steps.div_ceil(splits)),
    }
}

/// A GPU's SMs as the split-K kernels see them: how many clusters of each size, a block
/// an SM, fit at once. A cluster's blocks share a GPC, so where the GPCs' SMs are not a
/// multiple of the size some stay idle: the H200's 132 SMs hold 22 clusters of 5, not 26
/// (`bert-bench` prints the counts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLayout {
    /// Clusters of 1..=[`MAX_SPLITS`] blocks.
    clusters: [usize; MAX_SPLITS],
}

impl SmLayout {
    /// A GPU that holds `clusters[s - 1]` clusters of `s` blocks at once.
    pub fn new(clusters: [usize; MAX_SPLITS]) -> Self {
        Self { clusters }
    }

    /// `sms` SMs that clusters of any size tile, as the emulator plans for.
    pub fn uniform(sms: usize) -> Self {
        Self { clusters: core::array::from_fn(|i| sms / (i + 1)) }
    }

    /// The GPU's, from `cuOccupancyMaxActiveClusters` of a split-K kernel with all its
    /// stages (a block an SM by shared memory); `None` on the emulator.
    pub fn of(gpu: &Gpu) -> Result<Option<Self>> {
        if gpu.context().is_none() {
            return Ok(None);
        }
        let kernel = wgmma_split_f16_bias::load(gpu)?;
        let raw = kernel.raw();
        let mut clusters = [0; MAX_SPLITS];
        for (i, slots) in clusters.iter_mut().enumerate() {
            let size = i as u32 + 1;
            let config = LaunchConfig {
                grid: Dim3::new(1, 1, size),
                block: (THREADS as u32).into(),
                cluster: Some(Dim3::new(1, 1, size)),
                dynamic_smem_bytes: split_smem_bytes(SPLIT_STAGES),
                ..LaunchConfig::default()
            };
            *slots = raw.max_active_clusters(gpu.stream(), &raw.plan(&config)?)? as usize;
        }
        Ok(Some(Self { clusters }))
    }

    /// The layout to plan `gpu`'s split-K launches for: the GPU's ([`SmLayout::of`]), or
    /// `emulator_sms` uniform SMs on the emulator.
    pub fn planned(gpu: &Gpu, emulator_sms: usize) -> Result<Self> {
        Ok(Self::of(gpu)?.unwrap_or_else(|| Self::uniform(emulator_sms)))
    }

    /// Clusters of `size` blocks that fit at once (`size` in 1..=[`MAX_SPLITS`]).
    pub fn clusters(&self, size: usize) -> usize {
        self.clusters[size - 1]
    }

    /// The SMs (clusters of one block).
    pub fn sms(&self) -> usize {
        self.clusters[0]
    }
}

/// The tensor map of an N × K Bᵀ in the split-K kernels' boxes (64 × 64, 128-byte swizzle).
pub fn split_bt_map<'a, T: TmaElement>(gpu: &Gpu, bt: &'a Buffer<T>, (n, k): (usize, usize)) -> Result<TensorMap<'a>> {
    gpu.tensor_map_2d(bt, (n, k), (SPLIT_BN as u32, BK as u32), Swizzle::B128)
}

/// Bᵀ (N × K) of the operands' B (K × N), as the kernels take it.
pub fn transpose<T: Copy>(b: &[T], k: usize, n: usize) -> Vec<T> {
    (0..n * k).map(|i| b[i % k * n + i / k]).collect()
}

/// The tensor maps of A (M × K) and Bᵀ (N × K), in the kernels' boxes: made once per
/// shape, valid while the buffers are borrowed.
pub struct Maps<'a> {
    a: TensorMap<'a>,
    b: TensorMap<'a>,
}

impl<'a> Maps<'a> {
    /// Tensor maps of `a` and `bt` for an M × N × K GEMM.
    pub fn new<T: TmaElement>(gpu: &Gpu, a: &'a Buffer<T>, bt: &'a Buffer<T>, (m, n, k): (usize, usize, usize)) -> std::result::Result<Self, GemmError> {
        config(m, n, k, 1)?;
        Ok(Self { a: a_map(gpu, a, (m, k))?, b: bt_map(gpu, bt, (n, k))? })
    }
}

/// The tensor map of an M × K A, in the kernels' boxes (128 × 64, 128-byte swizzle).
pub fn a_map<'a, T: TmaElement>(gpu: &Gpu, a: &'a Buffer<T>, (m, k): (usize, usize)) -> Result<TensorMap<'a>> {
    gpu.tensor_map_2d(a, (m, k), (BM as u32, BK as u32), Swizzle::B128)
}

/// The tensor map of an N × K Bᵀ, in the kernels' boxes (256 × 64, 128-byte swizzle).
pub fn bt_map<'a, T: TmaElement>(gpu: &Gpu, bt: &'a Buffer<T>, (n, k): (usize, usize)) -> Result<TensorMap<'a>> {
    gpu.tensor_map_2d(bt, (n, k), (BN as u32, BK as u32), Swizzle::B128)
}

/// Blocks the emulator runs (so that each computes several tiles, as on a GPU).
const EMULATOR_BLOCKS: usize = 2;

/// An element type of the kernels, `f16` or `bf16`: its five kernels.
pub trait WgmmaType: HalfFloat + TmaElement + DeviceRepr {
    /// The type's name in reports.
    const NAME: &'static str;
    /// Its five kernels, loaded.
    type Loaded;
    /// Loads the five kernels.
    fn load(gpu: &Gpu) -> Result<Self::Loaded>;
    /// Launches the epilogue's kernel on checked buffers.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        loaded: &Self::Loaded,
        gpu: &Gpu,
        config: &LaunchConfig,
        epilogue: EpilogueKind,
        maps: &Maps<'_>,
        x: &Operands<Self>,
        out: &mut Buffer<Self>,
        m: u32,
        n: u32,
        k: u32,
    ) -> Result<()>;
}

macro_rules! wgmma_type {
    ($($t:ident, $loaded:ident: $plain:ident, $bias:ident, $bias_gelu:ident, $residual:ident, $scale:ident;)*) => {$(
        #[doc = concat!("The five ", stringify!($t), " kernels, loaded.")]
        pub struct $loaded {
            plain: $plain::Kernel,
            bias: $bias::Kernel,
            bias_gelu: $bias_gelu::Kernel,
            residual: $residual::Kernel,
            scale: $scale::Kernel,
        }

        impl WgmmaType for $t {
            const NAME: &'static str = stringify!($t);
            type Loaded = $loaded;

            fn load(gpu: &Gpu) -> Result<$loaded> {
                Ok($loaded {
                    plain: $plain::load(gpu)?,
                    bias: $bias::load(gpu)?,
                    bias_gelu: $bias_gelu::load(gpu)?,
                    residual: $residual::load(gpu)?,
                    scale: $scale::load(gpu)?,
                })
            }

            fn launch(
                loaded: &$loaded,
                gpu: &Gpu,
                config: &LaunchConfig,
                epilogue: EpilogueKind,
                maps: &Maps<'_>,
                x: &Operands<$t>,
                out: &mut Buffer<$t>,
                m: u32,
                n: u32,
                k: u32,
            ) -> Result<()> {
                let (s, a, b) = (gpu.stream(), maps.a.words(), maps.b.words());
                match epilogue {
                    EpilogueKind::None => loaded.plain.launch(s, config, a, b, out, m, n, k),
                    EpilogueKind::Bias => loaded.bias.launch(s, config, a, b, &x.bias, out, m, n, k),
                    EpilogueKind::BiasGelu => loaded.bias_gelu.launch(s, config, a, b, &x.bias, out, m, n, k),
                    EpilogueKind::Residual => loaded.residual.launch(s, config, a, b, &x.residual, out, m, n, k),
                    EpilogueKind::Scale => loaded.scale.launch(s, config, a, b, out, x.alpha, m, n, k),
                }
            }
        }
    )*};
}

wgmma_type! {
    bf16, Bf16Kernels: wgmma_bf16, wgmma_bf16_bias, wgmma_bf16_bias_gelu, wgmma_bf16_residual, wgmma_bf16_scale;
    f16, F16Kernels: wgmma_f16, wgmma_f16_bias, wgmma_f16_bias_gelu, wgmma_f16_residual, wgmma_f16_scale;
}

/// The five kernels of one element type, loaded, and the device's SM count.
pub struct Kernels<T: WgmmaType> {
    sms: usize,
    loaded: T::Loaded,
}

impl<T: WgmmaType> Kernels<T> {
    /// Loads the five kernels.
    pub fn load(gpu: &Gpu) -> Result<Self> {
        Ok(Self { sms: gpu.multiprocessors()?.unwrap_or(EMULATOR_BLOCKS), loaded: T::load(gpu)? })
    }

    /// `out = epilogue(a · bᵀ)` for an M × N × K GEMM whose A and Bᵀ `maps` describe
    /// (bias, residual and alpha from `x`), after checking the shape and buffers.
    pub fn launch(
        &self,
        gpu: &Gpu,
        epilogue: EpilogueKind,
        maps: &Maps<'_>,
        x: &Operands<T>,
        out: &mut Buffer<T>,
        (m, n, k): (usize, usize, usize),
    ) -> std::result::Result<(), GemmError> {
        let config = config(m, n, k, self.sms)?;
        let need = |what: &str, len: usize, need: usize| {
            if len < need {
                Err(GemmError::Shape(format!("{what} holds {len} elements; M = {m}, N = {n}, K = {k} needs {need}")))
            } else {
                Ok(())
            }
        };
        need("C", out.len(), m * n)?;
        match epilogue {
            EpilogueKind::Bias | EpilogueKind::BiasGelu => need("bias", x.bias.len(), n)?,
            EpilogueKind::Residual => need("residual", x.residual.len(), m * n)?,
            EpilogueKind::None | EpilogueKind::Scale => {}
        }
        Ok(T::launch(&self.loaded, gpu, &config, epilogue, maps, x, out, m as u32, n as u32, k as u32)?)
    }
}

/// A LayerNorm (γ, β) folded into the linear layer after it (`x·W + bias`, W `k × n` as
/// the `mma.sync` GEMM takes it), for [`FoldedNorm`]: W′ = diag(γ)·W rounded to f16, `c[j]` = Σ of
/// W′'s column j (as rounded), `d = bias + βᵀ·W`, the sums in f64.
pub fn fold_layer_norm(w: &[f16], (k, n): (usize, usize), bias: &[f16], gamma: &[f16], beta: &[f16]) -> (Vec<f16>, Vec<f32>, Vec<f32>) {
    assert!(w.len() == k * n && bias.len() == n && gamma.len() == k && beta.len() == k, "W is k × n, bias n, γ and β k");
    let folded: Vec<f16> = (0..k * n).map(|i| f16::from_f32((w[i].to_f64() * gamma[i / n].to_f64()) as f32)).collect();
    let (mut c, mut d) = (vec![0.0f64; n], vec![0.0f64; n]);
    for e in 0..k {
        for j in 0..n {
            c[j] += folded[e * n + j].to_f64();
            d[j] += w[e * n + j].to_f64() * beta[e].to_f64();
        }
    }
    let d = d.iter().zip(bias).map(|(&d, b)| (b.to_f64() + d) as f32).collect();
    (folded, c.into_iter().map(|c| c as f32).collect(), d)
}
