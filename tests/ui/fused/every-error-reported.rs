// Four independent mistakes, in the launch shape, a stage's scope, the dataflow and device
// Rust: all four are reported, not only the first.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 2048)]
pub mod k {
    use clusterfuse::prelude::*;

    #[stage(thread)]
    fn fetch(x: Global<&[f32]>) -> Registers<f32> {
        block::sync();
        x[thread::global_index_x()]
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        println!("{}", v);
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let v = fetch(x);
        let w = fetch(x);
        store(v, out);
    }
}

fn main() {}
