// A stage parameter bound by reference, not a plain name.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(thread)]
    fn twice(ref v: Registers<f32>) -> Registers<f32> {
        *v * 2.0
    }

    pub fn kernel(rows: u32) {
        let _ = rows;
    }
}

fn main() {}
