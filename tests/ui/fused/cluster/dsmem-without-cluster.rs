// Distributed shared memory in a kernel without clusters.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] tile: Shared<[f32; 128]>) {
        tile.store(thread::index_x() as usize, x[thread::global_index_x()]);
    }

    #[stage(block)]
    fn read(tile: Dsmem<[f32; 128]>) -> Registers<f32> {
        tile.load(0)
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let tile = fill(x);
        let v = read(tile);
        store(v, out);
    }
}

fn main() {}
