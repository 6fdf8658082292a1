// Static shared memory over the 48 KB ptxas allows: a stage with a 32 KB output called twice
// (each call its own array).
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;

    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] a: Shared<[f32; 8192]>) {
        a.store(0, x[0]);
    }

    #[stage(block)]
    fn add(a: Shared<[f32; 8192]>, b: Shared<[f32; 8192]>) -> Registers<f32> {
        a.load(0) + b.load(0)
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let a = fill(x);
        let b = fill(x);
        let v = add(a, b);
        store(v, out);
    }
}

fn main() {}
