// Thread and block stages, registers and shared memory, several outputs: one kernel whose
// facts and launch configuration come from the attribute.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("pass", "");

/// Each row divided by its sum; the row also copied to `copy`.
#[fused_kernel(grid = rows, block = 128, launch_bounds(max_threads = 256, min_blocks = 2))]
pub mod normalize {
    use clusterfuse::prelude::*;

    const ROW: usize = 128;

    #[stage(thread)]
    fn fetch(x: Global<&[f32]>, #[out] tile: Shared<[f32; ROW]>) -> Registers<f32> {
        let v = x[thread::global_index_x()];
        tile.store(thread::index_x() as usize, v);
        v
    }

    #[stage(block)]
    fn total(v: Registers<f32>, tile: Shared<[f32; 128]>, copy: Global<Out<f32>>) -> (Registers<f32>, Registers<f32>) {
        let mirrored = tile.load(ROW - 1 - thread::index_x() as usize);
        copy.set(thread::global_index_x(), mirrored);
        (block::reduce_sum(v, shared!([f32; 32])), mirrored)
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, sum: Registers<f32>, mirrored: Registers<f32>, out: Global<Out<f32>>, scale: f32) {
        out.set(thread::global_index_x(), scale * v / sum + 0.0 * mirrored);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, copy: Out<f32>, scale: f32, rows: u32) {
        let (tile, v) = fetch(x);
        let (sum, mirrored) = total(v, tile, copy);
        store(v, sum, mirrored, out, scale);
    }
}

fn main() {
    assert_eq!(normalize::FACTS.name, "normalize");
    assert_eq!(normalize::FACTS.max_threads, Some(256));
    assert_eq!(normalize::FACTS.min_blocks, Some(2));
    let config = normalize::config(7);
    assert_eq!((config.grid, config.block, config.cluster), (clusterfuse::Dim3::new(7, 1, 1), clusterfuse::Dim3::new(128, 1, 1), None));
    let _: fn(&clusterfuse::host::Gpu) -> clusterfuse::host::Result<normalize::Kernel> = normalize::load;
}
