// A cluster primitive expands to an inlined function with its scratch bound, and `FACTS`.
use clusterfuse::cluster::{Cluster, PrimitiveFacts};
use clusterfuse::prelude::*;

/// Block 0's `value`, everywhere.
#[cluster_primitive(shared(slot: [f32; 4]), barriers = 2)]
pub fn from_first(_scope: &Cluster, value: f32) -> f32 {
    if cluster::block_rank() == 0 && thread::rank_in_block() == 0 {
        for peer in 0..cluster::size() {
            slot.in_block(peer).store(0, value);
        }
    }
    cluster::sync();
    let first = slot.load(0);
    cluster::sync();
    first
}

#[cluster_primitive(barriers = 1)]
pub fn barrier(_scope: &Cluster) {
    cluster::sync();
}

fn main() {
    assert_eq!(from_first::FACTS, PrimitiveFacts { name: "from_first", shared_bytes: 16, barriers: 2 });
    assert_eq!(barrier::FACTS.shared_bytes, 0);
    let _: fn(&Cluster, f32) -> f32 = from_first;
}
