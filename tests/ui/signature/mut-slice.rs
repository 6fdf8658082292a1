use clusterfuse::prelude::*;

#[kernel]
pub fn k(y: &mut [f32]) {
    y[0] = 1.0;
}

fn main() {}
