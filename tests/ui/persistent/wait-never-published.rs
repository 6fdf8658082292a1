use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

// `y` is written but never published, so the block that waits for it would wait forever.
#[kernel(persistent, launch_bounds(max_threads = 128))]
pub fn chain(x: &[f32], y: Published<f32>, z: Out<f32>) {
    for i in block::stride_loop(0..64) {
        y.set(i, 2.0 * x[i]);
    }
    let ready = y.wait(0..64);
    z.set(0, ready.get(0));
}

fn main() {}
