// `Global<..>` around a scalar: global memory is a kernel buffer.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(thread)]
    fn fetch(x: Global<&[f32]>, scale: Global<f32>) -> Registers<f32> {
        x[thread::global_index_x()] * scale
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], scale: f32, out: Out<f32>, rows: u32) {
        let v = fetch(x, scale);
        store(v, out);
    }
}

fn main() {}
