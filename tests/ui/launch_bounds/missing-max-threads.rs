use clusterfuse::prelude::*;

#[kernel(launch_bounds(min_blocks = 2))]
pub fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
