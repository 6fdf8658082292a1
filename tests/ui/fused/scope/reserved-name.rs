// A stage named like the generated launcher's `load`.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;

    #[stage(thread)]
    fn load(x: Global<&[f32]>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), x[thread::global_index_x()]);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        load(x, out);
    }
}

fn main() {}
