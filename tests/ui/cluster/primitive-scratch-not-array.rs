// A shared scratch declared as a scalar, not an array.
use clusterfuse::cluster::Cluster;
use clusterfuse::prelude::*;

#[cluster_primitive(shared(scratch: f32), barriers = 1)]
pub fn total(scope: &Cluster) -> f32 {
    let _ = scope;
    0.0
}

fn main() {}
