// An unsafe fn kernel.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[kernel]
pub unsafe fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
