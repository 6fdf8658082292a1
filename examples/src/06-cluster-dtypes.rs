//! 06 — the cluster collectives over every element type: `cluster::reduce` (sum, max, min),
//! `cluster::broadcast` and `cluster::gather` for f32, f16, bf16 and i32, clusters of 1-16
//! blocks, 1 to 65536 elements per block (capped to what fits in 227 KB of shared memory).
//! `#[kernel]` functions cannot be generic, so a `macro_rules!` stamps out one pair per type.
//!
//! Each type is two checks against an f64 reference: sums, within a tolerance of a few
//! units of the type's rounding (exact for i32), and the operations that round nothing (max,
//! min, broadcast, gather), which must match exactly.

use clusterfuse::prelude::*;

/// `op` of the reduce kernels: the cluster's element-wise sum, maximum or minimum, or a
/// broadcast of the last block's vector.
pub const SUM: u32 = 0;
/// See [`SUM`].
pub const MAX: u32 = 1;
/// See [`SUM`].
pub const MIN: u32 = 2;
/// See [`SUM`].
pub const BROADCAST: u32 = 3;

macro_rules! collectives {
    ($($ty:ty => $reduce:ident, $gather:ident;)*) => {$(
        /// Block `b` loads `x[b*n ..]` into shared memory, the cluster applies `op` ([`SUM`],
        /// [`MAX`], [`MIN`], [`BROADCAST`]), and every block writes the result to `out[b*n ..]`.
        #[kernel(launch_bounds(max_threads = 256))]
        pub fn $reduce(x: &[$ty], out: Out<$ty>, n: u32, op: u32) {
            let n = n as usize;
            let data = shared::dynamic().take::<$ty>(n);
            let base = block::index_x() as usize * n;
            for i in block::stride_loop(0..n) {
                data.store(i, x[base + i]);
            }
            match op {
                SUM => cluster::reduce(data, Sum),
                MAX => cluster::reduce(data, Max),
                MIN => cluster::reduce(data, Min),
                _ => cluster::broadcast(data, cluster::size() - 1),
            }
            for i in block::stride_loop(0..n) {
                out.set(base + i, data.load(i));
            }
        }

        /// Block `b` contributes `x[b*m ..]`; every block writes the cluster's gathered tiles
        /// (`cluster::size() * m` values) to `out[b * size * m ..]`.
        #[kernel(launch_bounds(max_threads = 256))]
        pub fn $gather(x: &[$ty], out: Out<$ty>, m: u32) {
            let m = m as usize;
            let all_len = cluster::size() as usize * m;
            let mut smem = shared::dynamic();
            let (tile, all) = (smem.take::<$ty>(m), smem.take::<$ty>(all_len));
            let b = block::index_x() as usize;
            for i in block::stride_loop(0..m) {
                tile.store(i, x[b * m + i]);
            }
            cluster::gather(tile, all);
            for i in block::stride_loop(0..all_len) {
                out.set(b * all_len + i, all.load(i));
            }
        }
    )*};
}

collectives! {
    f32 => reduce_f32, gather_f32;
    f16 => reduce_f16, gather_f16;
    bf16 => reduce_bf16, gather_bf16;
    i32 => reduce_i32, gather_i32;
}

#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host {
    use super::*;
    use crate::check::Report;
    use clusterfuse::host::Result;
    use rand::Rng;

    /// Any `op` other than the reduce kernels': the gather kernel.
    const GATHER: u32 = 4;
    const CLUSTER_SIZES: [u32; 6] = [1, 2, 3, 4, 8, 16];
    const LENGTHS: [usize; 6] = [1, 7, 128, 1000, 4103, 65536];
    /// Clusters per launch, so that clusters are also checked not to mix.
    const CLUSTERS: u32 = 2;

    /// A host element type of the sweep.
    pub trait Dtype: Copy + PartialEq {
        /// The type's name in reports.
        const NAME: &'static str;
        /// What an output starts as, so that unwritten elements show.
        const POISON: Self;
        /// Bound on the sums' relative error: a few units of the type's rounding (0 for i32).
        const SUM_TOLERANCE: f64;
        /// A fresh random input value.
        fn random(rng: &mut impl Rng) -> Self;
        /// The value, exactly.
        fn to_f64(self) -> f64;
        /// The value as the report's `f32` (exact for the sweep's values); poison becomes NaN.
        fn to_report(self) -> f32 {
            if self == Self::POISON { f32::NAN } else { self.to_f64() as f32 }
        }
    }

    impl Dtype for f32 {
        const NAME: &'static str = "f32";
        const POISON: Self = f32::NAN;
        const SUM_TOLERANCE: f64 = 4.0 * f32::EPSILON as f64 / 2.0;
        fn random(rng: &mut impl Rng) -> Self {
            rng.random_range(-1.0..1.0)
        }
        fn to_f64(self) -> f64 {
            self as f64
        }
        fn to_report(self) -> f32 {
            self
        }
    }

    /// f16 and bf16: inputs rounded from f32, sums within 4 units of their precision.
    macro_rules! half_dtype {
        ($($ty:ident, $ulps_per_unit:literal;)*) => {$(
            impl Dtype for $ty {
                const NAME: &'static str = stringify!($ty);
                const POISON: Self = $ty::NAN;
                const SUM_TOLERANCE: f64 = 4.0 / $ulps_per_unit;
                fn random(rng: &mut impl Rng) -> Self {
                    HalfFloat::from_f32(rng.random_range(-1.0..1.0))
                }
                fn to_f64(self) -> f64 {
                    HalfFloat::to_f32(self) as f64
                }
                fn to_report(self) -> f32 {
                    HalfFloat::to_f32(self)
                }
            }
        )*};
    }

    half_dtype! {
        f16, 2048.0;
        bf16, 256.0;
    }

    impl Dtype for i32 {
        const NAME: &'static str = "i32";
        /// Never a result: inputs lie in ±2^20 and no identity is ever written.
        const POISON: Self = i32::MIN;
        const SUM_TOLERANCE: f64 = 0.0;
        fn random(rng: &mut impl Rng) -> Self {
            rng.random_range(-(1 << 20)..=1 << 20)
        }
        fn to_f64(self) -> f64 {
            self as f64
        }
    }

    /// One launch: `op` over clusters of `size` blocks, `n` elements per block.
    pub struct Case {
        pub op: u32,
        pub size: u32,
        pub n: usize,
    }

    impl Case {
        pub fn blocks(&self) -> usize {
            (CLUSTERS * self.size) as usize
        }

        pub fn out_len(&self) -> usize {
            let per_block = if self.op == GATHER { self.size as usize * self.n } else { self.n };
            self.blocks() * per_block
        }

        pub fn config(&self, elem_bytes: usize) -> LaunchConfig {
            let arrays = if self.op == GATHER { self.size as usize + 1 } else { 1 };
            LaunchConfig {
                grid: (self.blocks() as u32).into(),
                block: 256.into(),
                cluster: Some(self.size.into()),
                dynamic_smem_bytes: (arrays * self.n * elem_bytes + 16) as u32,
                ..LaunchConfig::default()
            }
        }

        /// The f64 reference of this case's output for input `x`.
        fn reference<T: Dtype>(&self, x: &[T]) -> Vec<f64> {
            let (size, n) = (self.size as usize, self.n);
            let mut out = Vec::with_capacity(self.out_len());
            for b in 0..self.blocks() {
                let first = b / size * size;
                let peers = || (first..first + size).map(|p| &x[p * n..(p + 1) * n]);
                match self.op {
                    GATHER => out.extend(peers().flatten().map(|v| v.to_f64())),
                    BROADCAST => out.extend(x[(first + size - 1) * n..][..n].iter().map(|v| v.to_f64())),
                    op => out.extend((0..n).map(|i| {
                        let values = peers().map(|peer| peer[i].to_f64());
                        match op {
                            SUM => values.sum(),
                            MAX => values.fold(f64::NEG_INFINITY, f64::max),
                            _ => values.fold(f64::INFINITY, f64::min),
                        }
                    })),
                }
            }
            out
        }
    }

    /// Runs `ops` over every cluster size and length through `launch` (input in, output
    /// downloaded out) and compares with the f64 reference. Lengths are capped to what fits
    /// in the device's shared memory; the emulator's shapes stop at 4103.
    pub fn sweep<T: Dtype>(gpu: &Gpu, ops: &[u32], mut launch: impl FnMut(&Case, &[T]) -> Result<Vec<T>>) -> Result<Report> {
        let (elem, smem_limit) = (size_of::<T>(), gpu.smem_limit());
        let lengths = crate::check::shape(gpu, &LENGTHS[..], &LENGTHS[..5]);
        let (mut outs, mut refs) = (Vec::new(), Vec::new());
        for &op in ops {
            for size in CLUSTER_SIZES {
                let arrays = if op == GATHER { size as usize + 1 } else { 1 };
                let cap = (smem_limit as usize - 16) / (arrays * elem);
                for &n in lengths {
                    let case = Case { op, size, n: n.min(cap) };
                    let x: Vec<T> = crate::check::with_rng(|rng| (0..case.blocks() * case.n).map(|_| T::random(rng)).collect());
                    let out = launch(&case, &x)?;
                    outs.extend(out.iter().map(|v| v.to_report()));
                    refs.extend(case.reference(&x));
                }
            }
        }
        let names: Vec<_> = ops.iter().map(|&op| ["sum", "max", "min", "bcast", "gather"][op as usize]).collect();
        let mut shape = format!("{} {}: clusters 1-16 × n 1..{}", T::NAME, names.join(","), lengths[lengths.len() - 1]);
        let cap = (smem_limit as usize - 16) / elem;
        if cap < lengths[lengths.len() - 1] && ops.iter().any(|&op| op != GATHER) {
            shape += &format!(" (n capped to {cap} by smem)");
        }
        if ops.contains(&GATHER) {
            shape += " (gather: m capped so (size+1)·m fits in smem)";
        }
        let tolerance = if ops == [SUM] { T::SUM_TOLERANCE } else { 0.0 };
        Ok(Report::new(shape, &outs, &refs, tolerance))
    }

    macro_rules! runners {
        ($($ty:ty => $reduce:ident, $gather:ident, $run:ident, $sums:ident, $exact:ident;)*) => {$(
            fn $run(gpu: &Gpu, ops: &[u32]) -> Result<Report> {
                let (reduce, gather) = (super::$reduce::load(gpu)?, super::$gather::load(gpu)?);
                sweep::<$ty>(gpu, ops, |case, x| {
                    let dx = gpu.upload(x)?;
                    let mut out = gpu.upload(&vec![<$ty as Dtype>::POISON; case.out_len()])?;
                    let config = case.config(size_of::<$ty>());
                    if case.op == GATHER {
                        gather.launch(gpu.stream(), &config, &dx, &mut out, case.n as u32)?;
                    } else {
                        reduce.launch(gpu.stream(), &config, &dx, &mut out, case.n as u32, case.op)?;
                    }
                    gpu.download(&out)
                })
            }

            #[doc = concat!("Sums of `", stringify!($ty), "` against f64, within the type's rounding.")]
            pub fn $sums(gpu: &Gpu) -> Result<Report> {
                $run(gpu, &[SUM])
            }

            #[doc = concat!("Max, min, broadcast and gather of `", stringify!($ty), "`: exact.")]
            pub fn $exact(gpu: &Gpu) -> Result<Report> {
                $run(gpu, &[MAX, MIN, BROADCAST, GATHER])
            }
        )*};
    }

    runners! {
        f32 => reduce_f32, gather_f32, run_f32, f32_sums, f32_exact;
        f16 => reduce_f16, gather_f16, run_f16, f16_sums, f16_exact;
        bf16 => reduce_bf16, gather_bf16, run_bf16, bf16_sums, bf16_exact;
        i32 => reduce_i32, gather_i32, run_i32, i32_sums, i32_exact;
    }
}
