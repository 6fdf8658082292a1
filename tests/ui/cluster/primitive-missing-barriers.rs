use clusterfuse::cluster::Cluster;
use clusterfuse::prelude::*;

#[cluster_primitive(shared(scratch: [u32; 16]))]
pub fn count(scope: &Cluster) -> u32 {
    let _ = scope;
    scratch.load(0)
}

fn main() {}
