// Kernels of every parameter kind, launch bounds and clusters expand to typed launchers.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("pass", "");

#[kernel(launch_bounds(max_threads = 256, min_blocks = 2))]
pub fn saxpy(a: f32, x: &[f32], y: Out<f32>) {
    let i = thread::global_index_x();
    if i < y.len() {
        y.set(i, a.fma(x[i], y.get(i)));
    }
}

#[kernel(cluster(16, non_portable))]
pub fn halves(x: &[f16], y: Out<bf16>, n: u32) {
    let _ = (x, y, n);
}

fn main() {
    assert_eq!(saxpy::FACTS.max_threads, Some(256));
    assert_eq!(saxpy::FACTS.min_blocks, Some(2));
    assert_eq!(halves::FACTS.cluster, Some(clusterfuse::Dim3::new(16, 1, 1)));
    let _: fn(&clusterfuse::host::Gpu) -> clusterfuse::host::Result<saxpy::Kernel> = saxpy::load;
}
