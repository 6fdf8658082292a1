//! 00 — the empty kernel: what a launch costs when the kernel does nothing
//! (used by the launch-overhead benchmark).

use clusterfuse::prelude::*;

/// Does nothing.
#[kernel]
pub fn empty() {}
