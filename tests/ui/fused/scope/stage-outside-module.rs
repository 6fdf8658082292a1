// `#[stage]` on a function that no `#[fused_kernel]` module holds.
use clusterfuse::prelude::*;

#[stage(block)]
fn lonely() {}

fn main() {
    lonely();
}
