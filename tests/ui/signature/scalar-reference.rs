// A reference that is neither &[T] nor Out<T>.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[kernel]
pub fn k(n: &u32, y: Out<f32>) {
    y.set(0, *n as f32);
}

fn main() {}
