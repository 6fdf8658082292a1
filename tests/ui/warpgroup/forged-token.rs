// A `Warpgroup` comes only from `Warpgroup::current()`, which checks the block is whole
// warpgroups: it cannot be built by hand.
use clusterfuse::warpgroup::Warpgroup;

fn main() {
    let _ = Warpgroup { index: 0 };
}
