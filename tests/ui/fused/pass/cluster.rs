// A cluster-scope collective between a block stage that writes shared memory and a stage
// that reads the peers' copies through DSMEM; the launch bound defaults to the block.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("pass", "");

#[fused_kernel(grid = rows * 4, block = 64, cluster(4), dynamic_smem = 1024)]
pub mod neighbours {
    use clusterfuse::prelude::*;

    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] tile: Shared<[f32; 64]>) {
        tile.store(thread::index_x() as usize, x[thread::global_index_x()]);
    }

    #[stage(cluster)]
    fn sum(#[out] tile: Dsmem<[f32; 64]>, local: Shared<[f32; 64]>) {
        tile.store(thread::index_x() as usize, local.load(thread::index_x() as usize));
        cluster::reduce(tile, Sum);
    }

    #[stage(block)]
    fn store(tile: Dsmem<[f32; 64]>, out: Global<Out<f32>>) {
        let next = tile.in_block((cluster::block_rank() + 1) % cluster::size());
        out.set(thread::global_index_x(), next.load(thread::index_x() as usize));
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let local = fill(x);
        let tile = sum(local);
        store(tile, out);
    }
}

fn main() {
    assert_eq!(neighbours::FACTS.cluster, Some(clusterfuse::Dim3::new(4, 1, 1)));
    assert_eq!(neighbours::FACTS.max_threads, Some(64));
    let config = neighbours::config(3);
    assert_eq!((config.grid.x, config.dynamic_smem_bytes), (12, 1024));
}
