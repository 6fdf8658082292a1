// A parameter that is a pattern, not a name.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[kernel]
pub fn k((a, b): (u32, u32), y: Out<f32>) {
    y.set(0, (a + b) as f32);
}

fn main() {}
