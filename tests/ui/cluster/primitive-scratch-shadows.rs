// A shared scratch named like a parameter, which it would hide in the body.
use clusterfuse::cluster::Cluster;
use clusterfuse::prelude::*;

#[cluster_primitive(shared(data: [f32; 16]), barriers = 2)]
pub fn total(scope: &Cluster, data: SharedSlice<f32>) -> f32 {
    let _ = scope;
    data.load(0)
}

fn main() {}
