use clusterfuse::prelude::*;

#[kernel]
pub fn k(y: *mut f32) {
    let _ = y;
}

fn main() {}
