// A fused kernel on a module declared in another file, not inline.
use clusterfuse::prelude::*;

#[fused_kernel(grid = 1, block = 32)]
pub mod k;

fn main() {}
