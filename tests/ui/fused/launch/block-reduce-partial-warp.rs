// A block reduction (built on full-mask warp shuffles) in a block that is not whole warps.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 100)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(block)]
    fn total(x: Global<&[f32]>) -> Registers<f32> {
        block::reduce_sum(x[thread::global_index_x()], shared!([f32; 32]))
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let v = total(x);
        store(v, out);
    }
}

fn main() {}
