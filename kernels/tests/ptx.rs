//! The library's PTX, checked without a GPU: every kernel assembled by `ptxas -arch=sm_90a`
//! with the shared memory it should use and its spills bounded; the decode block's and the
//! Llama projections' weights streamed 16 bytes at a time through registers and issued before
//! they wait for the previous kernel; the attention merges through DSMEM without atomics; the
//! MoE kernels stream their weights evict-first in L2, and their streaming loops, in SASS,
//! issue a chunk's loads together and do not spill.

use clusterfuse_kernels::__CLUSTERFUSE_PTX as PTX;

fn entry(name: &str) -> &'static str {
    clusterfuse_build::entry(PTX.text, name).unwrap_or_else(|| panic!("no entry `{name}` in the PTX"))
}

/// The definition of the device function whose (mangled) name contains `part`.
fn function(part: &str) -> &'static str {
    PTX.text
        .match_indices(".func ")
        .map(|(i, _)| &PTX.text[i..])
        .find(|f| {
            // A definition's parameter list is followed by its body, a declaration's by `;`.
            let rest = &f[f.find(')').unwrap_or(0)..];
            f.lines().next().is_some_and(|l| l.contains(part)) && rest.find('{') < rest.find(';')
        })
        .map(|f| &f[..f.find("\n}\n").unwrap_or(f.len())])
        .unwrap_or_else(|| panic!("no function `{part}` in the PTX"))
}

#[test]
fn the_cubin_of_every_kernel_is_embedded_beside_the_ptx() {
    // What a GPU loads (no JIT compilation at the first launch): ptxas's ELF of this PTX.
    assert!(PTX.cubin.starts_with(b"\x7fELF"), "the embedded cubin is not an ELF image ({} bytes): was the crate built without ptxas?", PTX.cubin.len());
    let entries: Vec<&str> = clusterfuse_build::entry_names(PTX.text).collect();
    assert!(entries.len() > 40, "only {} entries found in the PTX", entries.len());
    for name in entries {
        let symbol = [name.as_bytes(), b"\0"].concat();
        assert!(PTX.cubin.windows(symbol.len()).any(|w| w == symbol), "the cubin has no kernel `{name}`");
    }
}

#[test]
fn every_kernel_assembles_with_its_shared_memory_and_bounded_spills() {
    let (kernels, _) = clusterfuse_build::resources(PTX.text).unwrap_or_else(|e| panic!("{e}"));
    let expected_smem: &[(&str, u32)] = &[
        // The partial sums of a block's warps (64 B, twice: alternate items) and the RMSNorm
        // reduction's scratch.
        ("llama_embed", 0),
        ("llama_qkv", 256),
        ("llama_residual", 128),
        ("llama_gate_up", 256),
        ("llama_lm_head", 256),
        // The 8 warps' states of 4 query heads (8 KB + 256 B), the merged states, the queries.
        ("llama_attention", 8 * 4 * 66 * 4 + 4 * 68 * 4 + 4 * 64 * 4),
        // The persistent step: the attention's arrays, and the projections' partial sums and
        // reduction scratch, one set for all its projection stages (a `shared!` array is one
        // per call site, and the stages share `project`'s).
        ("llama_step", 8 * 4 * 66 * 4 + 4 * 68 * 4 + 4 * 64 * 4 + 256),
        ("decode_attention_f16", 25152),
        ("decode_attention_f16_b8", 25152),
        ("decode_attention_bf16", 25152),
        ("decode_attention_bf16_b8", 25152),
        ("decode_o_proj_f16", 0),
        ("decode_o_proj_f16_b8", 0),
        ("decode_o_proj_bf16", 0),
        ("decode_o_proj_bf16_b8", 0),
        ("decode_rms_norm", 128),
        ("decode_qkv", 0),
        ("decode_rope_append", 0),
        ("decode_attend", 8896),
        // The spread variant: the RMSNorm reduction's scratch; the attention's merge states.
        ("decode_qkv_rope_f16", 32),
        ("decode_qkv_rope_bf16", 32),
        ("decode_attend_appended_f16", 8896),
        ("decode_attend_appended_bf16", 8896),
        // The persistent block: fused 1/2's arrays (the output projection's staging is dynamic).
        ("decode_block_persistent_f16", 25152),
        ("decode_block_persistent_bf16", 25152),
        // The MoE layer's arrays are all dynamic (their sizes follow the tokens and experts).
        ("moe_gate_up_g8", 0),
        ("moe_gate_up_g16", 0),
        ("moe_down_g8", 0),
        ("moe_down_g16", 0),
        ("moe_gate_up_g32", 0),
        ("moe_gate_up_tokens", 0),
        ("moe_down_tokens", 0),
        ("moe_fused", 0),
        // Row softmax, RoPE, the norms (the block reductions' scratch; a warp a row: the
        // reductions' slots are never read, and ptxas drops them).
        ("softmax", 0),
        ("rope_f16", 0),
        ("rope_bf16", 0),
        ("layernorm_gelu", 2 * 32),
        ("add_rmsnorm", 32),
        ("layernorm_gelu_warps", 0),
        ("add_rmsnorm_warps", 0),
        ("add_bias", 0),
        ("layer_norm", 2 * 32),
        ("gelu_kernel", 0),
        ("add_residual", 0),
        ("rms_norm", 32),
        // The GEMMs: their tiles are dynamic shared memory.
        ("gemm_f16", 0),
        ("gemm_f16_bias", 0),
        ("gemm_f16_bias_gelu", 0),
        ("gemm_f16_residual", 0),
        ("gemm_f16_scale", 0),
        ("gemm_bf16", 0),
        ("gemm_bf16_bias", 0),
        ("gemm_bf16_bias_gelu", 0),
        ("gemm_bf16_residual", 0),
        ("gemm_bf16_scale", 0),
        ("wgmma_bf16", 0),
        ("wgmma_bf16_bias", 0),
        ("wgmma_bf16_bias_gelu", 0),
        ("wgmma_bf16_residual", 0),
        ("wgmma_bf16_scale", 0),
        ("wgmma_f16", 0),
        ("wgmma_f16_bias", 0),
        ("wgmma_f16_bias_gelu", 0),
        ("wgmma_f16_residual", 0),
        ("wgmma_f16_scale", 0),
        ("wgmma_split_f16", 0),
        ("wgmma_split_f16_bias", 0),
        ("wgmma_split_f16_bias_gelu", 0),
        ("wgmma_split_f16_residual", 0),
        ("wgmma_split_f16_folded_ln_bias", 0),
        ("wgmma_split_f16_folded_ln_bias_gelu", 0),
        ("wgmma_split_f16_residual_stats", 0),
        ("wgmma_split_f16_ln_residual_stats", 0),
        ("layer_norm_rows", 0),
        // BERT's attention: K (or V) and the block's queries staged with 16-byte-padded rows
        // of 64 halves; `attention_split` by TMA, 128-byte rows from a 1024-aligned point (1 KB
        // to align), then the four warps' partial states (37 words a lane) and its pipeline's
        // two mbarriers.
        ("attention_scores", (128 + 64) * 72 * 2),
        ("attention_context", 128 * 72 * 2),
        ("attention", (2 * 128 + 64) * 72 * 2),
        ("attention_split", ((2 * 128 + 16) * 64 + 512) * 2 + 4 * 32 * 37 * 4 + 32),
        ("bias_layer_norm", 2 * 32),
    ];
    assert_eq!(kernels.len(), expected_smem.len(), "kernels: {:?}", kernels.keys());
    for &(name, smem) in expected_smem {
        let r = &kernels[name];
        if name.starts_with("decode_block_persistent_") {
            // The persistent block spills at 128 registers (results/decode-h200.md): a bound,
            // so that it cannot grow unseen.
            assert!(r.spill_store_bytes <= 896 && r.spill_load_bytes <= 896 && r.stack_frame_bytes <= 448, "`{name}` spills: {r:?}");
        } else if name.starts_with("decode_attention_") && name.ends_with("_b8") {
            // The batch-8 tile at 128 registers: two values spilled at entry and reloaded
            // outside the streaming loops (16 bytes; `cuobjdump -sass` shows where).
            assert!(r.spill_store_bytes <= 16 && r.spill_load_bytes <= 16 && r.stack_frame_bytes <= 8, "`{name}` spills: {r:?}");
        } else if name == "llama_step" {
            // The persistent step's stages spill (results/llama-h200.md): a bound, so that it
            // cannot grow unseen.
            assert!(r.spill_store_bytes <= 768 && r.spill_load_bytes <= 1152 && r.stack_frame_bytes <= 1152, "`{name}` spills: {r:?}");
        } else if name.starts_with("moe_") {
            // At 128 registers (two blocks per SM): values outside the streaming loops, and the
            // routing's call frame, 48 bytes larger with its one-token path and 32 more (in
            // `moe_gate_up_g32`, spills unchanged) with `DynamicShared::take`'s check that no
            // byte count is truncated (a bound, so that it cannot grow unseen;
            // `moe_streaming_loops_...` checks the loops).
            assert!(r.spill_store_bytes <= 400 && r.spill_load_bytes <= 640 && r.stack_frame_bytes <= 480, "`{name}` spills: {r:?}");
        } else if name == "llama_qkv" || name == "llama_residual" {
            // The item loop at 128 registers: a few loop-invariant values stored once before
            // it and reloaded once an item (`cuobjdump -sass`), none in the dot products.
            assert!(r.spill_store_bytes <= 32 && r.spill_load_bytes <= 32 && r.stack_frame_bytes <= 48, "`{name}` spills: {r:?}");
        } else {
            assert_eq!((r.spill_store_bytes, r.spill_load_bytes, r.stack_frame_bytes), (0, 0, 0), "`{name}` spills: {r:?}");
        }
        assert_eq!(r.static_smem_bytes, smem, "`{name}` static shared memory: {r:?}");
    }
    // Two blocks of 256 threads per SM, so that clusters of 4 over 32 heads are resident at
    // once; the batch-1 output projection and the spread variant's kernels fit two blocks per
    // SM as well; the Llama attention, so that its clusters fit beside the QKV kernel's blocks.
    for name in [
        "decode_attention_f16",
        "decode_attention_f16_b8",
        "decode_attention_bf16",
        "decode_attention_bf16_b8",
        "decode_o_proj_f16",
        "decode_o_proj_bf16",
        "decode_qkv_rope_f16",
        "decode_qkv_rope_bf16",
        "decode_attend_appended_f16",
        "decode_attend_appended_bf16",
        "llama_attention",
        "moe_gate_up_g8",
        "moe_gate_up_g16",
        "moe_down_g8",
        "moe_down_g16",
        "moe_gate_up_g32",
    ] {
        assert!(kernels[name].registers <= 128, "{name}: {:?}", kernels[name]);
    }
}

#[test]
fn llama_projections_stream_weights_before_waiting() {
    for name in ["llama_qkv", "llama_residual", "llama_gate_up", "llama_lm_head"] {
        let text = entry(name);
        assert!(text.contains(".maxntid 256, 1, 1") && text.contains(".minnctapersm 2"), "`{name}`: launch bounds");
        let wait = text.find("griddepcontrol.wait;").unwrap_or_else(|| panic!("`{name}` never waits for its prerequisite"));
        // All 16 of a lane's 16-byte weight loads go out before the wait, and the RMSNorm
        // weights' vector where there is one.
        let norm = usize::from(name != "llama_residual");
        assert_eq!(text[..wait].matches("ld.global.nc.v4.b32").count(), 16 + norm, "`{name}`: weight loads before the wait");
        assert!(text[..wait].contains("griddepcontrol.launch_dependents;"), "`{name}` lets its dependent launch before it waits");
        // The gate/up kernel's one atomic: its published gate table's count of retired blocks.
        let retirements = text.matches("atom.acq_rel.gpu.global.add.u32").count();
        assert!(text.matches("atom.").count() == retirements && retirements <= usize::from(name == "moe_gate_up_tokens"), "`{name}` must not use atomics (but the gate table's retirement)");
    }
    let text = entry("llama_attention");
    let wait = text.find("griddepcontrol.wait;").expect("the attention waits for the QKV kernel");
    // Cached keys and values (written by the QKV kernels) through the coherent path.
    assert!(text[..wait].contains("ld.global.v4.b32"), "`llama_attention`: no cached k, v load before the wait");
    assert!(text.contains("ld.shared::cluster") && !text.contains("atom."), "`llama_attention`: DSMEM merge, no atomics");
    // The blocks' merge: one barrier to publish their states, one to keep them until read.
    assert_eq!(text.matches("barrier.cluster.arrive").count(), 2, "`llama_attention`: cluster barriers");
}

#[test]
fn decode_attention_streams_16_byte_vectors() {
    for name in ["decode_attention_f16", "decode_attention_bf16_b8"] {
        let text = entry(name);
        assert!(text.contains(".maxntid 256, 1, 1") && text.contains(".minnctapersm 2"), "`{name}`: launch bounds");
        // Weights through the read-only path into registers (no bulk copies: a ring of them
        // in shared memory halved this kernel's speed), the cache (written by this kernel)
        // coherently.
        assert!(text.contains("ld.global.nc.v4.b32"), "`{name}`: weights are not loaded 16 bytes at a time");
        assert!(!text.contains(BULK_LOAD), "`{name}`: W_qkv is streamed by bulk copies");
        assert!(text.contains("ld.global.v4.b32"), "`{name}`: the cache is not loaded 16 bytes at a time");
        assert!(text.contains("ld.shared::cluster.v4.b32"), "`{name}`: the cluster reduction does not move 16-byte vectors");
        // The sum over heads is the second launch's: no atomics, so the output is deterministic.
        // The gate/up kernel's one atomic: its published gate table's count of retired blocks.
        let retirements = text.matches("atom.acq_rel.gpu.global.add.u32").count();
        assert!(text.matches("atom.").count() == retirements && retirements <= usize::from(name == "moe_gate_up_tokens"), "`{name}` must not use atomics (but the gate table's retirement)");
    }
    // The output projection streams W_o the same way (through registers: with a ring of bulk
    // copies it took 14.2-14.7 µs alone on the H200, 12.5 µs so).
    let text = entry("decode_o_proj_f16");
    assert!(!text.contains(BULK_LOAD) && !text.contains("atom."), "`decode_o_proj_f16`: W_o through registers, no atomics");
}

/// A bulk copy from global to shared memory, completing on an mbarrier.
const BULK_LOAD: &str = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes";

#[test]
fn decode_o_proj_loads_w_o_before_waiting_for_the_attention() {
    for name in ["decode_attention_f16", "decode_attention_bf16_b8"] {
        assert_eq!(entry(name).matches("griddepcontrol.launch_dependents;").count(), 1, "`{name}` triggers its dependent once");
    }
    for name in ["decode_o_proj_f16", "decode_o_proj_bf16_b8"] {
        let text = entry(name);
        let wait = text.find("griddepcontrol.wait;").unwrap_or_else(|| panic!("`{name}` never waits for its prerequisite"));
        // The first item of W_o (R rows × V vectors a lane: 2 × 4 at batch 1, 4 × 2 at tile 8).
        assert_eq!(text[..wait].matches("ld.global.nc.v4.b32").count(), 8, "`{name}`: W_o loads before the wait");
    }
}

/// No kernel reads global memory ahead of its programmatic wait more than its PTX does
/// ([`clusterfuse_build::check_programmatic_waits`]): ptxas issued x's loads ahead of the
/// wait in `layernorm_gelu` and `bias_layer_norm` until activations took the coherent path
/// (`global::load16`).
#[test]
fn no_global_load_moves_ahead_of_the_programmatic_wait() {
    let sass = clusterfuse_build::Sass::new(PTX.cubin).unwrap_or_else(|e| panic!("{e}"));
    let waiting = clusterfuse_build::check_programmatic_waits(PTX.text, &sass).unwrap_or_else(|e| panic!("{e}"));
    assert!(waiting >= 50, "only {waiting} kernels wait for a prerequisite");
}

/// A persistent kernel reads its published buffers' generation after its programmatic wait
/// (`Published::from_raw_parts`), so that it may follow the buffer's previous user — itself,
/// step after step — under programmatic dependent launch: read before the wait, the
/// generation could be the one that user's last block has yet to advance, and the kernel
/// would take the previous launch's flags for its own.
#[test]
fn persistent_kernels_read_their_generation_after_the_programmatic_wait() {
    let mut persistent = 0;
    // A published buffer's retirement: its count of retired blocks, the one acq_rel atomic.
    for name in clusterfuse_build::entry_names(PTX.text).filter(|name| entry(name).contains("atom.acq_rel.gpu.global.add.u32")) {
        let text = entry(name);
        let wait = text.find("griddepcontrol.wait;").unwrap_or_else(|| panic!("`{name}` never waits for its prerequisite"));
        let epoch = text.find("ld.relaxed.gpu.global").unwrap_or_else(|| panic!("`{name}` never reads its generation"));
        assert!(wait < epoch, "`{name}` reads its generation before its programmatic wait");
        persistent += 1;
    }
    // The MoE layer's tokens gate/up and fused kernels, the decode block's two, the Llama step.
    assert!(persistent >= 5, "only {persistent} kernels retire a published buffer");
}

#[test]
fn moe_streams_experts_through_tensor_cores_without_atomics() {
    for name in MOE_KERNELS {
        let text = entry(name);
        assert!(text.contains(".maxntid 256, 1, 1") && text.contains(".minnctapersm 2"), "`{name}`: launch bounds");
        assert!(text.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "`{name}`: no bf16 tensor-core mma");
        // The combine sums in a fixed order: the output is deterministic. The routing's masks
        // and counts (an OR, a count of ones) are the only atomics, in shared memory.
        let atomics = text.matches("atom.").count();
        let order_free = text.matches("atom.shared.or.b32").count() + text.matches("atom.shared.add.u32").count();
        assert_eq!(atomics, order_free, "`{name}`: an atomic whose result depends on the order");
    }
    for name in MOE_KERNELS.iter().filter(|k| k.contains("gate_up")) {
        let text = entry(name);
        // Weights through the read-only path, 16 bytes a lane (2-4 K-steps × 2 matrices × 2
        // rows), evict-first in L2.
        assert!(text.matches("ld.global.nc.L2::cache_hint.v4.b32").count() >= 8, "`{name}`: weight loads");
        assert!(text.contains("createpolicy.fractional.L2::evict_first.b64"), "`{name}`: no evict-first policy");
        assert!(text.contains("moe5route"), "`{name}` does not route");
        // Groups of 8 (the staged schedule) copy `x` into shared memory.
        assert_eq!(text.contains("cp.async.cg.shared.global"), name.ends_with("_g8"), "`{name}`: x staged");
    }
    // The routing (one function both kernels call): the cluster top-k posts candidates and
    // the softmax's partial sums into peers' mailboxes (`st.async` on their mbarriers), and a
    // single token's routing its logits, each after one cluster barrier whose arrival is
    // relaxed — no `MEMBAR.ALL.GPU`.
    let route = function("moe5route");
    assert!(route.contains("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64"), "the top-k does not post through DSMEM");
    assert!(route.contains("mbarrier.try_wait.parity.acquire.cluster"), "the top-k does not wait for its mailbox");
    let barriers = route.matches("barrier.cluster.arrive").count();
    assert_eq!((barriers, route.matches("barrier.cluster.arrive.relaxed").count()), (2, 2), "routing: one relaxed cluster barrier on each path");
    // The down kernel waits for the gate/up kernel before it reads the routing and `h`.
    for name in MOE_KERNELS.iter().filter(|k| k.contains("down")) {
        assert!(entry(name).contains("griddepcontrol.wait;"), "`{name}` never waits for the gate/up kernel");
    }
}

const MOE_KERNELS: [&str; 5] = [
    "moe_gate_up_g8",
    "moe_gate_up_g16",
    "moe_gate_up_g32",
    "moe_down_g8",
    "moe_down_g16",
];

/// The innermost loops of a kernel's SASS that run `mma` (`HMMA`) or `wgmma` (`HGMMA`)
/// instructions, as `op` says (a loop is a backward branch's span): each one's instructions.
fn innermost_mma_loops(sass: &str, op: &str) -> Vec<Vec<String>> {
    let code: Vec<(u64, String)> = sass
        .lines()
        .filter_map(|line| {
            let (address, rest) = line.trim().strip_prefix("/*")?.split_once("*/")?;
            // The instruction without its predicate (`@P0`, `@!P1`).
            let instruction = rest.split(';').next()?.trim();
            let instruction = if instruction.starts_with('@') { instruction.split_once(' ')?.1.trim() } else { instruction };
            Some((u64::from_str_radix(address, 16).ok()?, instruction.to_string()))
        })
        .collect();
    let body = |(start, end): (u64, u64)| code.iter().filter(|(at, _)| (start..=end).contains(at)).map(|(_, text)| text.clone()).collect::<Vec<_>>();
    let target = |text: &str| text.split_once("BRA 0x").and_then(|(_, t)| u64::from_str_radix(t.trim(), 16).ok());
    let loops: Vec<(u64, u64)> = code.iter().filter_map(|(at, text)| target(text).filter(|&t| t < *at).map(|t| (t, *at))).filter(|&span| body(span).iter().any(|i| i.starts_with(op))).collect();
    // Innermost: no other such loop's backward branch inside it (an outer loop may branch
    // back into the middle of an inner one's span).
    loops.iter().filter(|&&(start, end)| !loops.iter().any(|&(s, e)| (s, e) != (start, end) && (start..end).contains(&e))).map(|&span| body(span)).collect()
}

/// The streaming loops ptxas made of the MoE kernels, in SASS: every innermost loop that runs
/// `mma`s (`HMMA`; the routing's and the projections') issues all its global loads (`LDG`)
/// before its first `mma`, so that a chunk of K-steps costs one memory round trip, and
/// touches no local memory (`LDL`/`STL`: spills). The warp schedule's groups of 32, which keep
/// `x` in registers beside the weights, do not meet it at 128 registers (half of a chunk's
/// loads come first) and are left out.
#[test]
fn moe_streaming_loops_issue_their_loads_together_without_spilling() {
    let sass = clusterfuse_build::Sass::new(PTX.cubin).unwrap_or_else(|e| panic!("{e}"));
    for name in MOE_KERNELS.into_iter().filter(|k| *k != "moe_gate_up_g32") {
        let loops = innermost_mma_loops(&sass.of(name).unwrap_or_else(|e| panic!("{e}")), "HMMA");
        assert!(!loops.is_empty(), "`{name}`: no mma loop found");
        for body in loops {
            let loads = |part: &[String]| part.iter().filter(|i| i.contains("LDG")).count();
            let first_mma = body.iter().position(|i| i.starts_with("HMMA")).unwrap();
            assert!(loads(&body) > 0 && loads(&body[..first_mma]) == loads(&body), "`{name}`: {} of a loop's {} global loads come before its first mma", loads(&body[..first_mma]), loads(&body));
            assert!(!body.iter().any(|i| i.contains("LDL") || i.contains("STL")), "`{name}`: a streaming loop spills");
        }
    }
}

/// The MoE tokens schedule and the fused one: weights and the tokens' operand through TMA
/// (3-D boxes of 8 row tiles, 2-D boxes of every token) into `wgmma`s at one block an SM,
/// nothing atomic (but the retirement of the gate/up kernel's published gate table, or the
/// fused kernel's partial outputs), the down kernel waiting for the gate/up one, the fused
/// kernel's consumer warpgroup ordering its `h` tile before its `wgmma`s read it (a proxy
/// fence, then its own barrier), the fused kernel's on B operands of 8 token rows (it takes
/// at most 8 tokens); in SASS, main loops of 8 `wgmma`s a stage (`HGMMA`: four accumulators
/// × two 16-column slices, or two × four) that never touch local memory.
#[test]
fn moe_tokens_schedule_feeds_wgmma_from_tma_without_spilling() {
    let sass = clusterfuse_build::Sass::new(PTX.cubin).unwrap_or_else(|e| panic!("{e}"));
    // The fused kernel's down loop is two 128-row groups of two stages each, unrolled: 32.
    for (name, wgmmas) in [("moe_gate_up_tokens", &[8][..]), ("moe_down_tokens", &[8]), ("moe_fused", &[8, 32])] {
        let text = entry(name);
        assert!(text.contains(".maxntid 256, 1, 1") && text.contains(".minnctapersm 1"), "`{name}`: launch bounds");
        assert!(text.contains("cp.async.bulk.tensor.3d") && text.contains("cp.async.bulk.tensor.2d"), "`{name}`: TMA loads");
        // The weights' boxes (3-D) evict-first in L2, the tokens' (2-D) not.
        let tma = |dims: &str, hinted: bool| text.lines().filter(|l| l.contains(&format!("cp.async.bulk.tensor.{dims}")) && l.contains(".L2::cache_hint") == hinted).count();
        assert!(tma("3d", true) > 0 && tma("3d", false) == 0 && tma("2d", true) == 0, "`{name}`: the weights' TMA loads must be evict-first, the tokens' not");
        assert!(text.contains("createpolicy.fractional.L2::evict_first.b64"), "`{name}`: no evict-first policy");
        // The fused kernel's at most 8 tokens: B operands of 8 rows.
        let shape = if name == "moe_fused" { "m64n8k16" } else { "m64n64k16" };
        assert!(text.contains(&format!("wgmma.mma_async.sync.aligned.{shape}.f32.bf16.bf16")), "`{name}`: no {shape} wgmma");
        // The gate/up and fused kernels' one atomic: their published buffer's count of
        // retired blocks.
        let retirements = text.matches("atom.acq_rel.gpu.global.add.u32").count();
        assert!(text.matches("atom.").count() == retirements && retirements <= usize::from(name != "moe_down_tokens"), "`{name}` must not use atomics (but its published buffer's retirement)");
        let loops = innermost_mma_loops(&sass.of(name).unwrap_or_else(|e| panic!("{e}")), "HGMMA");
        assert!(!loops.is_empty(), "`{name}`: no wgmma loop found");
        for body in loops {
            let count = body.iter().filter(|i| i.starts_with("HGMMA")).count();
            assert!(wgmmas.contains(&count), "`{name}`: {count} wgmmas a loop, not {wgmmas:?}");
            assert!(!body.iter().any(|i| i.contains("LDL") || i.contains("STL")), "`{name}`: a main loop spills");
        }
    }
    assert!(entry("moe_gate_up_tokens").contains("moe12route_tokens"), "the tokens schedule's gate/up kernel does not route");
    assert!(entry("moe_fused").contains("moe11route_fused"), "the fused kernel does not route");
    let fused = entry("moe_fused");
    let fence = fused.find("fence.proxy.async.shared::cta;");
    assert!(fence.is_some_and(|at| fused[at..].contains(", 128;")), "the fused kernel's `h` tile: no proxy fence, then its warpgroup's barrier");
    assert!(entry("moe_down_tokens").contains("griddepcontrol.wait;"), "the tokens schedule's down kernel never waits for the gate/up kernel");
}
