use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

// A block holds at most 1024 threads.
#[kernel(launch_bounds(max_threads = 2048))]
pub fn scale(x: &[f32], y: Out<f32>) {
    let i = thread::global_index_x();
    y.set(i, 2.0 * x[i]);
}

fn main() {}
