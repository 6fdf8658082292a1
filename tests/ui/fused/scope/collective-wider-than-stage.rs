// A block collective in a stage declared warp-scope.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(warp)]
    fn fetch(x: Global<&[f32]>) -> Registers<f32> {
        block::reduce_sum(x[thread::global_index_x()], shared!([f32; 32]))
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let v = fetch(x);
        store(v, out);
    }
}

fn main() {}
