use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

// Fused kernels have no grid-scope stages: a published buffer is a persistent kernel's.
#[fused_kernel(grid = 4, block = 128)]
pub mod chain {
    use super::*;
    #[stage(thread)]
    pub fn copy(x: Global<&[f32]>, z: Global<Out<f32>>) {
        let i = thread::global_index_x();
        z.set(i, x[i]);
    }
    pub fn kernel(x: &[f32], y: Published<f32>, z: Out<f32>) {
        copy(x, z);
    }
}

fn main() {}
