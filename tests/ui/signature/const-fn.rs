// A const fn kernel.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

#[kernel]
pub const fn k(n: u32) {
    let _ = n;
}

fn main() {}
