// A kernel parameter bound by reference: the launcher passes it by value.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(thread)]
    fn store(out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), 1.0);
    }

    pub fn kernel(out: Out<f32>, ref rows: u32) {
        store(out);
    }
}

fn main() {}
