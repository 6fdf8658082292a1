use clusterfuse::prelude::*;

#[kernel(blocks = 4)]
pub fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
