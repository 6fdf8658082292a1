use clusterfuse::prelude::*;

#[kernel(cluster(2, 2, 1, 1))]
pub fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
