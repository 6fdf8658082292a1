//! 15 — a mixture-of-experts layer at decode: the kernel library's
//! [`clusterfuse_kernels::moe`] (routing by a cluster top-k over DSMEM, then the selected
//! experts' SiLU-gated FFNs on tensor cores with the combine fused into the down
//! projection; two launches, or one on the fused schedule, `15-moe-fused`), checked against
//! its f64 reference: the routing exactly, the gate weights and the output by relative
//! error, each step launched twice for bitwise-equal outputs.

use crate::check::{shape, with_rng, Report};
use clusterfuse::host::{Gpu, Result};
use clusterfuse_kernels::moe::host::{gate_up_cluster, multiprocessors, plan_schedule, schedule, step, Buffers, Kernels, Layer, Moe, Reference, Schedule, Timeline, TOLERANCE};
use rand::Rng;

/// Small layers on the emulator (Mixtral-like top 2 of 8 with renormalised gates, DeepSeek-like
/// top 4 of 16 over the full softmax, at 1, 5 and 24 tokens, and top 2 of 4 at 20 tokens, so
/// that pairs come in groups of 8, 16 (8 K-steps: a last chunk of 2) and 32, top 1 of 8 at 3
/// tokens, top 2 of 8 over clusters of 8 (a block's one expert, fewer than k), top 4 of 16 at
/// one token with hidden 512, top 2 of 4 at 4 tokens with hidden 1152 (the staged gate/up
/// window of `x` and a part of one), top 1 of 4 with FFN 6400 (one item's long runs of down
/// K-steps), top 8 of 160 at 3 tokens over clusters of 2 (80 experts a block: the top-k's
/// rounds, not its ranks); on the tokens schedule, top 2 of 8 at 24 tokens and top 1 of 8 at
/// 1 token over down clusters of 8 (blocks with no K-steps); on the dense schedule, top 4 of 16 at 40 tokens
/// (`plan`'s choice there: 10 pairs an expert) and top 1 of 8 at 2 tokens (experts no token
/// chose); on the fused schedule (one launch), top 4 of 16 at 1 token, top 2 of 8 at 5 and
/// top 1 of 8 at 8; clusters of 2, 4 and 8; one router row doubled
/// so that two experts tie); Mixtral-8x7B and DeepSeek-V2-Lite shapes at 8 and 64 tokens on a
/// GPU, each on the schedule and cluster `plan` takes (two on each), and both at 1 token on
/// the fused schedule (Mixtral's 224 units on at most 132 blocks: blocks that take two).
pub fn run(gpu: &Gpu) -> Result<Report> {
    check(gpu, |schedule| schedule != Schedule::Fused)
}

/// The fused schedule's cases alone (compute-sanitizer's racecheck fails inside the tool on
/// its kernel, so `scripts/gpu-run.sh` leaves this example out of that tool's run).
pub fn run_fused(gpu: &Gpu) -> Result<Report> {
    check(gpu, |schedule| schedule == Schedule::Fused)
}

/// [`run`]'s cases whose schedule is `wanted`.
fn check(gpu: &Gpu, wanted: impl Fn(Schedule) -> bool) -> Result<Report> {
    let kernels = Kernels::load(gpu)?;
    let mixtral_like = Layer { hidden: 128, experts: 8, top_k: 2, ffn: 64, renormalize: true };
    let deepseek_like = Layer { hidden: 256, experts: 16, top_k: 4, ffn: 96, renormalize: false };
    let few_experts = Layer { hidden: 128, experts: 4, top_k: 2, ffn: 64, renormalize: false };
    let top_1 = Layer { hidden: 128, experts: 8, top_k: 1, ffn: 64, renormalize: false };
    let wide = Layer { hidden: 512, experts: 16, top_k: 4, ffn: 64, renormalize: false };
    // Wider than the staged schedule's window of x: a whole window, then a part of one.
    let windows = Layer { hidden: 1152, experts: 4, top_k: 2, ffn: 32, renormalize: true };
    // More local experts than a warp ranks key by key (80 a block): the top-k's rounds.
    let many_experts = Layer { hidden: 128, experts: 160, top_k: 8, ffn: 32, renormalize: false };
    // One item's K-steps of the down projection spread over a cluster's warps in long runs.
    let long_ffn = Layer { hidden: 128, experts: 4, top_k: 1, ffn: 6400, renormalize: false };
    // The tokens schedule's shapes: whole 128-row tiles.
    let tokens_mixtral_like = Layer { hidden: 128, experts: 8, top_k: 2, ffn: 128, renormalize: true };
    let tokens_deepseek_like = Layer { hidden: 256, experts: 16, top_k: 4, ffn: 256, renormalize: false };
    let tokens_top_1 = Layer { hidden: 128, experts: 8, top_k: 1, ffn: 128, renormalize: false };
    let sms = multiprocessors(gpu)?;
    // (layer, tokens, gate/up cluster or `plan`'s, schedule)
    let planned = |layer: Layer, tokens: usize, cluster: u32| (layer, tokens, Some(cluster), schedule(&layer, tokens, sms));
    let on_pairs = |layer: Layer, tokens: usize, cluster: u32| (layer, tokens, Some(cluster), Schedule::pairs(&layer, tokens));
    let on_tokens = |layer: Layer, tokens: usize, cluster: u32| (layer, tokens, Some(cluster), Schedule::Tokens);
    let on_dense = |layer: Layer, tokens: usize, cluster: u32| (layer, tokens, Some(cluster), Schedule::Dense);
    let on_fused = |layer: Layer, tokens: usize, cluster: u32| (layer, tokens, Some(cluster), Schedule::Fused);
    let as_planned = |layer: Layer, tokens: usize| (layer, tokens, None, schedule(&layer, tokens, sms));
    let cases = shape(
        gpu,
        vec![
            as_planned(Layer::MIXTRAL_8X7B, 8),
            as_planned(Layer::DEEPSEEK_V2_LITE, 8),
            as_planned(Layer::MIXTRAL_8X7B, 64),
            as_planned(Layer::DEEPSEEK_V2_LITE, 64),
            (Layer::MIXTRAL_8X7B, 1, Some(2), Schedule::Fused),
            (Layer::DEEPSEEK_V2_LITE, 1, Some(4), Schedule::Fused),
        ],
        vec![
            planned(mixtral_like, 1, 2),
            planned(mixtral_like, 5, 8),
            planned(deepseek_like, 24, 4),
            planned(few_experts, 20, 2),
            planned(top_1, 3, 8),
            planned(wide, 1, 4),
            planned(deepseek_like, 1, 2),
            planned(windows, 4, 2),
            // `plan` takes the fused schedule here (50 units of 128 rows: fewer than the SMs).
            on_pairs(long_ffn, 1, 2),
            planned(many_experts, 3, 2),
            on_tokens(tokens_mixtral_like, 24, 2),
            planned(tokens_deepseek_like, 40, 4),
            on_tokens(tokens_top_1, 1, 2),
            on_dense(tokens_top_1, 2, 2),
            on_fused(tokens_deepseek_like, 1, 2),
            on_fused(tokens_mixtral_like, 5, 4),
            on_fused(tokens_top_1, 8, 2),
        ],
    );
    let (mut outs, mut refs, mut runs) = (Vec::new(), Vec::new(), Vec::new());
    for (layer, tokens, cluster, schedule) in cases.into_iter().filter(|case| wanted(case.3)) {
        let mut moe = Moe::random(layer, tokens, with_rng(|rng| rng.random()))?;
        // Experts 1 and 2 get the same router row: every token's logits tie there, and the
        // lower index must win.
        let h = layer.hidden;
        let row: Vec<_> = moe.router[h..2 * h].to_vec();
        moe.router[2 * h..3 * h].copy_from_slice(&row);
        let reference = Reference::new(&moe);
        let mut b = Buffers::upload(gpu, &moe)?;
        let cluster = match cluster {
            Some(cluster) => cluster,
            None => gate_up_cluster(&kernels, gpu, layer, tokens, schedule)?,
        };
        let plan = plan_schedule(&kernels, gpu, layer, tokens, cluster, true, schedule)?;
        step(&kernels, gpu.stream(), &mut b, &plan)?;
        let first = b.results(gpu)?;
        b.poison(gpu)?;
        b.record_timeline(gpu, &plan)?;
        step(&kernels, gpu.stream(), &mut b, &plan)?;
        let second = b.results(gpu)?;
        // Every block stamps its points in order.
        let timeline = b.timeline(gpu, &plan)?;
        let stamped = timeline.is_some_and(|Timeline { gate_up, down, in_order, .. }| in_order && gate_up[3] > 0.0 && down.map_or(plan.schedule == Schedule::Fused, |down| down[2] > 0.0));
        let same = first.0.iter().chain(&first.2).zip(second.0.iter().chain(&second.2)).all(|(a, b)| a.to_bits() == b.to_bits()) && first.1 == second.1;
        let differs = reference.routing_mismatches(&second.1, layer.experts);
        // A routing that differs, a second run that does, or a timeline out of order counts
        // as unwritten outputs.
        let agrees = same && differs.is_empty() && stamped;
        let (own, own_refs): (Vec<f32>, Vec<f64>) = (second.0.iter().chain(&second.2).copied().collect(), reference.out.iter().chain(&reference.gates).copied().collect());
        // A case that fails shows its outputs' own error, which its unwritten count hides.
        let verdict = if agrees { String::new() } else { format!(", its outputs' rel error {:.2e}{}", Report::new(String::new(), &own, &own_refs, TOLERANCE).rel_error, if same { "" } else { ", a second run differs" }) };
        outs.extend(own.iter().map(|&v| if agrees { v } else { f32::NAN }));
        refs.extend(own_refs);
        let mismatch = if differs.is_empty() { String::new() } else { format!(", routing differs at (token, slot, ours, reference) {:?}", &differs[..differs.len().min(4)]) };
        runs.push(format!("{tokens} tok × top {} of {} (hidden {h}, ffn {}), {} experts used, cluster {cluster}, {:?}{mismatch}{}{verdict}", layer.top_k, layer.experts, layer.ffn, reference.selected(layer.experts), plan.schedule, if stamped { String::new() } else { format!(", timeline out of order: {timeline:?}") }));
    }
    Ok(Report::new(runs.join("; "), &outs, &refs, TOLERANCE))
}
