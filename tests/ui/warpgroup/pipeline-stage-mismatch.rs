// A pipeline's position carries its stage count: a 3-stage state on a 4-stage pipeline does
// not compile.
use clusterfuse::tma::{Pipeline, PipelineState};

pub fn wait(pipeline: &Pipeline<4>) {
    pipeline.consumer_wait(PipelineState::<3>::START);
}

fn main() {}
