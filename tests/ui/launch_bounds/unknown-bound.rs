use clusterfuse::prelude::*;

#[kernel(launch_bounds(max_threads = 256, max_registers = 64))]
pub fn k(y: Out<f32>) {
    y.set(0, 1.0);
}

fn main() {}
