// Reading peers' shared memory with no cluster collective after it was written.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows * 2, block = 128, cluster(2))]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] tile: Shared<[f32; 128]>) {
        tile.store(thread::index_x() as usize, x[thread::global_index_x()]);
    }

    #[stage(cluster)]
    fn read(tile: Dsmem<[f32; 128]>) -> Registers<f32> {
        tile.in_block(cluster::block_rank() ^ 1).load(thread::index_x() as usize)
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
