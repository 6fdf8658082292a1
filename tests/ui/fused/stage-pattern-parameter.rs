// A stage parameter that is a pattern, not a name.
use clusterfuse::prelude::*;

#[fused_kernel(grid = rows, block = 128)]
pub mod k {
    use clusterfuse::prelude::*;
    #[stage(thread)]
    fn sum((a, b): (Registers<f32>, Registers<f32>)) -> Registers<f32> {
        a + b
    }

    pub fn kernel(rows: u32) {
        let _ = rows;
    }
}

fn main() {}
