use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

// Blocks that wait on each other must all be resident: a `Published` buffer needs `persistent`.
#[kernel(launch_bounds(max_threads = 128))]
pub fn chain(y: Published<f32>, z: Out<f32>) {
    y.publish(0..1);
    let ready = y.wait(0..64);
    z.set(0, ready.get(0));
}

fn main() {}
