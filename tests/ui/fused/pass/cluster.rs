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

// A block stage's shared output read by its peers in the very next stage: the plan puts the
// cluster barrier before the read (and one at the end), no cluster stage needed between.
#[fused_kernel(grid = 8, block = 32, cluster(2))]
pub mod relay {
    use clusterfuse::prelude::*;

    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] tile: Shared<[f32; 32]>) {
        tile.store(thread::index_x() as usize, x[thread::global_index_x()]);
    }

    #[clusterfuse::stage(block)] // the attribute by its path
    fn swap(tile: Dsmem<[f32; 32]>, out: Global<Out<f32>>) {
        let peer = tile.in_block(cluster::block_rank() ^ 1);
        out.set(thread::global_index_x(), peer.load(thread::index_x() as usize));
    }

    pub fn kernel(x: &[f32], out: Out<f32>) {
        let tile = fill(x);
        swap(tile, out);
    }
}

fn main() {
    assert_eq!(neighbours::FACTS.cluster, Some(clusterfuse::Dim3::new(4, 1, 1)));
    assert_eq!(neighbours::FACTS.max_threads, Some(64));
    let config = neighbours::config(3);
    assert_eq!((config.grid.x, config.dynamic_smem_bytes), (12, 1024));

    // On the emulator, which faults on a block that exits while its peers may still read its
    // shared memory: the planned barriers keep every block until the last DSMEM read.
    let gpu = clusterfuse::host::Gpu::emulator();
    let x: Vec<f32> = (0..12 * 64).map(|i| (i % 97) as f32).collect();
    let (dx, mut out) = (gpu.upload(&x).unwrap(), gpu.upload(&vec![f32::NAN; x.len()]).unwrap());
    neighbours::load(&gpu).unwrap().launch(gpu.stream(), &config, &dx, &mut out, 3).unwrap();
    // Each block stores the cluster's sum of its tile, read from the next block's copy.
    let out = gpu.download(&out).unwrap();
    for (i, &got) in out.iter().enumerate() {
        let (cluster, t) = (i / (4 * 64), i % 64);
        let want: f32 = (0..4).map(|b| x[(cluster * 4 + b) * 64 + t]).sum();
        assert_eq!(got, want, "element {i}");
    }

    let x: Vec<f32> = (0..8 * 32).map(|i| i as f32).collect();
    let (dx, mut out) = (gpu.upload(&x).unwrap(), gpu.upload(&vec![f32::NAN; x.len()]).unwrap());
    relay::load(&gpu).unwrap().launch(gpu.stream(), &relay::config(), &dx, &mut out).unwrap();
    let swapped: Vec<f32> = (0..x.len()).map(|i| x[i ^ 32]).collect();
    assert_eq!(gpu.download(&out).unwrap(), swapped);
}
