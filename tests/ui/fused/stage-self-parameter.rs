// A stage that takes `self`, as if it were a method.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(thread)]
    fn store(self, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), 1.0);
    }

    pub fn kernel(out: Out<f32>, rows: u32) {
        store(out);
    }
}

fn main() {}
