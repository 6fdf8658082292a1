// A parameter type no launcher can pass (a function pointer).
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[kernel]
pub fn k(f: fn() -> f32, y: Out<f32>) {
    y.set(0, f());
}

fn main() {}
