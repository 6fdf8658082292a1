//! The MoE layer's host side without a GPU: the tiled weight layout the kernels read, the
//! schedule and clusters a step takes (on the emulator's device: 132 SMs, no limit on
//! resident blocks), and the shapes the kernels refuse before launching.

use clusterfuse::bf16;
use clusterfuse::host::{Error, Gpu};
use clusterfuse_kernels::moe::host::{plan, plan_schedule, schedule, tile, Buffers, Kernels, Layer, Moe, Schedule};

#[test]
fn tiling_keeps_16_rows_of_32_columns_together_in_k_order() {
    let (rows, cols) = (32, 96);
    // Every element's bits are its row-major index.
    let w: Vec<bf16> = (0..rows * cols).map(|i| bf16::from_bits(i as u16)).collect();
    let tiled = tile(&w, cols);
    for r in 0..rows {
        for c in 0..cols {
            // Row tile r / 16 is a block of 16 × 96; inside it, tile c / 32, then row, column.
            let at = r / 16 * 16 * cols + c / 32 * 512 + r % 16 * 32 + c % 32;
            assert_eq!(tiled[at].to_bits() as usize, r * cols + c, "element ({r}, {c})");
        }
    }
}

#[test]
fn steps_take_the_schedule_their_shape_streams_fastest() {
    let (mixtral, deepseek) = (Layer::MIXTRAL_8X7B, Layer::DEEPSEEK_V2_LITE);
    let pairs = |group| Schedule::Pairs { gate_up_group: group, down_group: group.min(16) };
    // (layer, tokens, SMs, schedule): one token on the fused schedule where it fits, whatever
    // its units (DeepSeek's 8 experts are 88 of 128 rows, Mixtral's 2 are 224); 2 tokens on
    // it only with fewer units than SMs (DeepSeek's 16 experts are 176).
    let cases = [
        (mixtral, 1, 132, Schedule::Fused),
        (mixtral, 2, 132, pairs(8)),
        (mixtral, 8, 132, pairs(8)),
        (mixtral, 64, 132, Schedule::Dense),
        (deepseek, 1, 132, Schedule::Fused),
        (deepseek, 1, 80, Schedule::Fused),
        (deepseek, 2, 132, pairs(8)),
        (Layer { ffn: 128, ..deepseek }, 2, 132, Schedule::Fused),
        (deepseek, 8, 132, Schedule::Tokens),
        (deepseek, 64, 132, Schedule::Dense),
        (Layer { ffn: 1400, ..deepseek }, 1, 132, pairs(8)),
        // Few units, but 4 tokens' partial output of hidden 16384 (256 KB) outgrows a block.
        (Layer { hidden: 16384, experts: 8, top_k: 1, ffn: 128, renormalize: false }, 4, 132, Schedule::Tokens),
    ];
    for (layer, tokens, sms, expected) in cases {
        assert_eq!(schedule(&layer, tokens, sms), expected, "{layer:?} at {tokens} tokens on {sms} SMs");
    }
}

#[test]
fn steps_that_fill_every_sm_route_in_clusters_of_2_the_others_in_clusters_of_4() {
    let gpu = Gpu::emulator();
    let kernels = Kernels::load(&gpu).unwrap();
    let (mixtral, deepseek) = (Layer::MIXTRAL_8X7B, Layer::DEEPSEEK_V2_LITE);
    // (layer, tokens, gate/up cluster): DeepSeek's 8 experts of one token want 88 blocks.
    for (layer, tokens, cluster) in [(mixtral, 1, 2), (mixtral, 8, 2), (mixtral, 64, 2), (deepseek, 1, 4), (deepseek, 8, 2), (deepseek, 64, 2)] {
        let plan = plan(&kernels, &gpu, layer, tokens, true).unwrap_or_else(|e| panic!("{layer:?} at {tokens} tokens: {e}"));
        assert_eq!(plan.gate_up.cluster.map(|c| c.x), Some(cluster), "{layer:?} at {tokens} tokens");
        assert_eq!(plan.schedule, schedule(&layer, tokens, 132), "{layer:?} at {tokens} tokens");
    }
}

#[test]
fn only_the_tokens_schedule_starts_gate_up_beside_the_previous_down_kernel() {
    let gpu = Gpu::emulator();
    let kernels = Kernels::load(&gpu).unwrap();
    let (mixtral, deepseek) = (Layer::MIXTRAL_8X7B, Layer::DEEPSEEK_V2_LITE);
    // Pairs (Mixtral 1, 8), fused (DeepSeek 1), tokens (DeepSeek 8), dense (both at 64).
    for (layer, tokens) in [(mixtral, 1), (mixtral, 8), (mixtral, 64), (deepseek, 1), (deepseek, 8), (deepseek, 64)] {
        for programmatic in [true, false] {
            let plan = plan(&kernels, &gpu, layer, tokens, programmatic).unwrap_or_else(|e| panic!("{layer:?} at {tokens} tokens: {e}"));
            let expected = programmatic && plan.schedule == Schedule::Tokens;
            assert_eq!(plan.gate_up.programmatic, expected, "{layer:?} at {tokens} tokens, {:?}", plan.schedule);
            // The fused schedule is one launch.
            let down = (plan.schedule != Schedule::Fused).then_some(programmatic);
            assert_eq!(plan.down.map(|down| down.programmatic), down, "{layer:?} at {tokens} tokens");
        }
    }
}

#[test]
fn the_fused_schedule_is_one_launch_of_a_block_a_unit_and_refuses_what_it_cannot_hold() {
    let gpu = Gpu::emulator();
    let kernels = Kernels::load(&gpu).unwrap();
    let (mixtral, deepseek) = (Layer::MIXTRAL_8X7B, Layer::DEEPSEEK_V2_LITE);
    // A block a unit of 128 features of the experts a step can select, at most one an SM (the
    // emulator plans for 132): DeepSeek's 8 experts of one token, 16 of 2 tokens (176 units),
    // up to 64 of 8, Mixtral's 2 (224).
    for (layer, tokens, cluster, blocks) in [(deepseek, 1, 4, 88), (deepseek, 2, 2, 132), (mixtral, 1, 2, 132), (deepseek, 8, 2, 132)] {
        let plan = plan_schedule(&kernels, &gpu, layer, tokens, cluster, true, Schedule::Fused).unwrap_or_else(|e| panic!("{layer:?} at {tokens} tokens: {e}"));
        assert!(plan.down.is_none() && !plan.gate_up.programmatic, "{layer:?} at {tokens} tokens: {plan:?}");
        assert_eq!(plan.gate_up.grid.x, blocks, "{layer:?} at {tokens} tokens");
    }
    let refused = |layer: Layer, tokens: usize| match plan_schedule(&kernels, &gpu, layer, tokens, 2, true, Schedule::Fused) {
        Err(err @ (Error::UnsupportedShape { .. } | Error::InvalidLaunch { .. })) => err.to_string(),
        other => panic!("{layer:?} at {tokens} tokens: {other:?}"),
    };
    assert!(refused(deepseek, 9).contains("9 tokens"));
    // Mixtral's partial output of 8 tokens (128 KB) does not fit beside the pipeline and the
    // routing (DeepSeek's 64 KB does).
    assert!(refused(mixtral, 8).contains("shared memory"), "{}", refused(mixtral, 8));
}

#[test]
fn unsupported_layers_are_refused_with_the_reason() {
    let refused = |layer: Layer, tokens: usize, cluster: u32| match layer.check(tokens, cluster) {
        Err(Error::UnsupportedShape { reason, .. }) => reason,
        other => panic!("{layer:?} at {tokens} tokens, cluster {cluster}: {other:?}"),
    };
    let mixtral = Layer::MIXTRAL_8X7B;
    assert!(refused(mixtral, 65, 4).contains("65 tokens"));
    assert!(refused(mixtral, 0, 4).contains("0 tokens"));
    assert!(refused(Layer { top_k: 9, ..Layer::DEEPSEEK_V2_LITE }, 1, 4).contains("top 9 of 64"));
    assert!(refused(Layer { top_k: 3, experts: 2, ..mixtral }, 1, 2).contains("top 3 of 2"));
    assert!(refused(mixtral, 1, 3).contains("clusters of 3"));
    assert!(refused(mixtral, 1, 1).contains("clusters of 1"));
    assert!(refused(Layer { hidden: 4000, ..mixtral }, 1, 4).contains("hidden 4000"));
    assert!(refused(Layer { ffn: 14330, ..mixtral }, 1, 4).contains("FFN 14330"));
    assert!(refused(Layer { ffn: 0, ..mixtral }, 1, 4).contains("FFN 0"));
    for (layer, cluster) in [(mixtral, 4), (mixtral, 8), (Layer::DEEPSEEK_V2_LITE, 4), (Layer::DEEPSEEK_V2_LITE, 16)] {
        for tokens in [1, 8, 64] {
            layer.check(tokens, cluster).unwrap_or_else(|e| panic!("{layer:?} at {tokens}: {e}"));
        }
    }
}

#[test]
fn uploading_arrays_that_do_not_fit_the_layer_is_refused_with_the_array() {
    let gpu = Gpu::emulator();
    let layer = Layer { hidden: 128, experts: 8, top_k: 2, ffn: 64, renormalize: true };
    let moe = Moe::random(layer, 3, 7).unwrap();
    Buffers::upload(&gpu, &moe).unwrap_or_else(|e| panic!("a layer that fits: {e}"));
    let refused = |moe: Moe| match Buffers::upload(&gpu, &moe) {
        Err(Error::UnsupportedShape { reason, .. }) => reason,
        other => panic!("{:?}", other.map(|_| "uploaded")),
    };
    let mut short = moe.clone();
    short.w_up.pop();
    assert_eq!(refused(short), "`w_up` holds 65535 values; 512 rows (experts × FFN) × 128 (hidden) is 65536");
    let mut wide = moe.clone();
    wide.x.extend([bf16::ZERO; 128]);
    assert!(refused(wide).starts_with("`x` holds 512 values; 3 rows (tokens)"));
    assert!(refused(Moe { tokens: 65, ..moe }).contains("65 tokens"));
}
