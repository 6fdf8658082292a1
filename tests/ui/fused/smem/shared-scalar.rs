// `Shared<..>` around a scalar: shared memory holds arrays.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(block)]
    fn fill(x: Global<&[f32]>, #[out] total: Shared<f32>) {
        let _ = (x, total);
    }

    #[stage(block)]
    fn read(total: Shared<[f32; 1]>) -> Registers<f32> {
        total.load(0)
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let total = fill(x);
        let v = read(total);
        store(v, out);
    }
}

fn main() {}
