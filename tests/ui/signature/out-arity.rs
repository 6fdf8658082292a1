// Out with two element types.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[kernel]
pub fn k(y: Out<f32, f32>) {
    let _ = y;
}

fn main() {}
