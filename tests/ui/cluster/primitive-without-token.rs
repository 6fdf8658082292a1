use clusterfuse::prelude::*;

#[cluster_primitive(barriers = 1)]
pub fn exchange(data: SharedSlice<f32>) {
    cluster::sync();
    let _ = data;
}

fn main() {}
