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

#[kernel(persistent, launch_bounds(max_threads = 128))]
pub fn chain(y: Published<f32>, z: Out<f32>) {
    if block::index_x() == 0 {
        y.set(thread::index_x() as usize, 1.0);
        y.publish(0..1);
    }
    let ready = y.wait(0..64);
    z.set(0, ready.get(0));
}

fn main() {
    assert_eq!(saxpy::FACTS.max_threads, Some(256));
    assert_eq!(saxpy::FACTS.min_blocks, Some(2));
    assert_eq!(halves::FACTS.cluster, Some(clusterfuse::Dim3::new(16, 1, 1)));
    assert!(chain::FACTS.persistent && !saxpy::FACTS.persistent);
    let _: fn(&chain::Kernel, &clusterfuse::host::Stream, &clusterfuse::host::LaunchConfig, &mut clusterfuse::host::Published<f32>, &mut clusterfuse::host::Buffer<f32>) -> clusterfuse::host::Result<()> = chain::Kernel::launch;
    let _: fn(&clusterfuse::host::Gpu) -> clusterfuse::host::Result<saxpy::Kernel> = saxpy::load;
}
