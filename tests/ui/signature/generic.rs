use clusterfuse::prelude::*;

#[kernel]
pub fn k<T: Copy>(x: &[T], y: Out<T>) {
    y.set(0, x[0]);
}

fn main() {}
