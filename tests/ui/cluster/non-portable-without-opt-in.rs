use clusterfuse::prelude::*;

#[kernel(cluster(16))]
pub fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
