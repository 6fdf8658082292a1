// A cluster_primitive argument that does not exist (`syncs` for `barriers`).
use clusterfuse::cluster::Cluster;
use clusterfuse::prelude::*;

#[cluster_primitive(syncs = 1)]
pub fn total(scope: &Cluster) -> f32 {
    let _ = scope;
    0.0
}

fn main() {}
