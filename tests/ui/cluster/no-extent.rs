// A cluster without its extent.
use clusterfuse::prelude::*;

#[kernel(cluster())]
pub fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
