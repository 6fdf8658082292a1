// Static shared memory of two stages plus dynamic shared memory over 227 KB.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128, dynamic_smem = 200_000)]
pub mod k {
    use clusterfuse::prelude::*;
    const ROW: usize = 8_000;

    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] a: Shared<[f32; ROW]>, #[out] b: Shared<[f32; 2_000]>) {
        a.store(0, x[0]);
        b.store(0, x[0]);
    }

    #[stage(block)]
    fn read(a: Shared<[f32; ROW]>, b: Shared<[f32; 2_000]>) -> Registers<f32> {
        block::reduce_sum(a.load(0) + b.load(0), shared!([f32; 32]))
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let (a, b) = fill(x);
        let v = read(a, b);
        store(v, out);
    }
}

fn main() {}
