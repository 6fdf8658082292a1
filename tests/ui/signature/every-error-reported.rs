use clusterfuse::prelude::*;

// Three independent mistakes: all three are reported, not only the first.
#[kernel(launch_bounds(max_threads = 0), cluster(32))]
pub fn k(y: &mut [f32]) {
    y[0] = 1.0;
}

fn main() {}
