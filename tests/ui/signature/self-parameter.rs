// A kernel written as a method, taking `self`.
use clusterfuse::prelude::*;

#[doc(hidden)]
pub static __CLUSTERFUSE_PTX: clusterfuse::host::Ptx = clusterfuse::host::Ptx::new("ui", "");

pub struct Saxpy;

impl Saxpy {
    #[kernel]
    pub fn k(&self, y: Out<f32>) {
        y.set(0, 1.0);
    }
}

fn main() {}
