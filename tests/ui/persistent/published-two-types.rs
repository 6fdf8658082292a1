use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

// A published buffer has one element type.
#[kernel(persistent, launch_bounds(max_threads = 128))]
pub fn chain(y: Published<f32, u32>, z: Out<f32>) {
    let _ = (y, z);
}

fn main() {}
