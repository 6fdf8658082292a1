// A stage argument that is an expression, not a value's name (one error: the value it uses
// counts as consumed).
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

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let v = fetch(x);
        store(v * 2.0, out);
    }
}

fn main() {}
