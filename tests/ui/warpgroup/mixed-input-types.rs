// Both wgmma operands have the accumulators' input type: bf16 A with f16 B does not compile.
use clusterfuse::warpgroup::{AccM64N256, Operand, Warpgroup};
use clusterfuse::{bf16, f16};

pub fn step(wg: Warpgroup, tile: u32, acc: &mut AccM64N256) {
    let a = Operand::<bf16>::k_major_swizzle_128b(tile, 0);
    let b = Operand::<f16>::k_major_swizzle_128b(tile, 0);
    unsafe { wg.mma_m64n256k16(a, b, acc, true) };
}

fn main() {}
