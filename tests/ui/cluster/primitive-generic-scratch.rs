use clusterfuse::cluster::Cluster;
use clusterfuse::prelude::*;

#[cluster_primitive(shared(scratch: [T; 16]), barriers = 2)]
pub fn max_of<T: Copy>(scope: &Cluster, value: T) -> T {
    let _ = (scope, scratch);
    value
}

fn main() {}
