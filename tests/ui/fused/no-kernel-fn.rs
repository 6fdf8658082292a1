// A fused kernel module without `pub fn kernel`.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(thread)]
    fn fetch(x: Global<&[f32]>) -> Registers<f32> {
        x[thread::global_index_x()]
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }


}

fn main() {}
