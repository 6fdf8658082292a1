// `shared!` given a scalar type instead of an array.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(block)]
    fn fetch(x: Global<&[f32]>) -> Registers<f32> {
        let scratch = shared!(f32);
        scratch.store(0, x[0]);
        scratch.load(0)
    }

    #[stage(thread)]
    fn store(v: Registers<f32>, out: Global<Out<f32>>) {
        out.set(thread::global_index_x(), v);
    }

    pub fn kernel(x: &[f32], out: Out<f32>, rows: u32) {
        let v = fetch(x);
        store(v, out);
    }
}

fn main() {}
