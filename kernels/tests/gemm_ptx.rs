//! The library's dense kernels in PTX and SASS, checked without a GPU: the fused norms (one
//! entry, 16-byte accesses, L2 prefetches); the GEMM on the tensor cores (`mma.sync`,
//! `ldmatrix`, `cp.async` in the PTX; `HMMA`, `LDSM`, `LDGSTS` in the SASS); the warpgroup GEMM
//! (`wgmma.mma_async`, TMA, `setmaxnreg` in the PTX; `HGMMA`, `UTMALDG` in the SASS); its
//! split-K kernels; BERT's attention by TMA and its batch-1 projections one block an SM by
//! registers.

use clusterfuse_build::KernelResources;
use clusterfuse_kernels::__CLUSTERFUSE_PTX as PTX;
use std::collections::BTreeMap;
use std::sync::OnceLock;

/// The text of one `.entry`, from its header to its closing brace.
fn entry(name: &str) -> &'static str {
    clusterfuse_build::entry(PTX.text, name).unwrap_or_else(|| panic!("no entry `{name}` in the PTX"))
}

/// Every kernel's resources, and ptxas's whole report (its performance warnings included):
/// one assembly of the library (tens of seconds) for the tests that ask.
fn resources_and_report() -> &'static (BTreeMap<String, KernelResources>, String) {
    static REPORT: OnceLock<(BTreeMap<String, KernelResources>, String)> = OnceLock::new();
    REPORT.get_or_init(|| clusterfuse_build::resources(PTX.text).unwrap_or_else(|e| panic!("{e}")))
}

/// The library assembled for sm_90a, and a function disassembling one kernel's SASS.
fn sass_of_library() -> impl Fn(&str) -> String {
    let sass = clusterfuse_build::Sass::new(PTX.cubin).unwrap_or_else(|e| panic!("{e}"));
    move |kernel: &str| sass.of(kernel).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn softmax_has_its_launch_bound() {
    assert!(entry("softmax").contains(".maxntid 256, 1, 1"));
}

#[test]
fn fused_kernels_are_one_entry_with_16_byte_accesses() {
    for (kernel, threads) in [("layernorm_gelu", 256), ("add_rmsnorm", 256), ("layernorm_gelu_warps", 128), ("add_rmsnorm_warps", 128)] {
        let text = entry(kernel);
        assert!(text.contains(&format!(".maxntid {threads}, 1, 1")), "`{kernel}` lacks its declared launch bound");
        assert!(text.contains("ld.global.v4.b32") && text.contains("st.global.v4.b32"), "`{kernel}` lacks 16-byte accesses");
        // Parameters through the read-only path; activations, which the previous kernel may
        // write, through the coherent one.
        assert!(text.contains("ld.global.nc.v4.b32"), "`{kernel}` reads no parameter through the read-only path");
    }
    // Up to four 16-byte vectors per thread: RMSNorm writes them to the residual and the
    // output, LayerNorm → GELU to the output; each store twice, in the branch-free path of
    // rows the block's vectors cover exactly and in the one that tests each vector.
    assert_eq!(entry("add_rmsnorm").matches("st.global.v4.b32").count(), 16);
    assert_eq!(entry("layernorm_gelu").matches("st.global.v4.b32").count(), 8);
    for kernel in ["layernorm_gelu", "add_rmsnorm", "layernorm_gelu_warps", "add_rmsnorm_warps"] {
        assert!(entry(kernel).contains("cp.async.bulk.prefetch.L2.global"), "`{kernel}` prefetches no rows into L2");
    }
}


/// The GEMM kernels' entries, as (name, input type).
fn gemm_kernels() -> Vec<(String, &'static str)> {
    let epilogues = ["", "_bias", "_bias_gelu", "_residual", "_scale"];
    ["f16", "bf16"].into_iter().flat_map(|t| epilogues.map(|e| (format!("gemm_{t}{e}"), t))).collect()
}

#[test]
fn gemm_runs_on_the_tensor_cores_from_a_cp_async_pipeline() {
    for (kernel, t) in gemm_kernels() {
        let text = entry(&kernel);
        let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32");
        // Per k-step of 64: 4 k-slices × (4 × 4 mma, 4 ldmatrix of A, 2 of B pairs); 8 copies
        // per thread, issued in the loop and twice in the prologue.
        assert_eq!(text.matches(&mma).count(), 64, "`{kernel}`: mma.sync per k-step");
        assert_eq!(text.matches("ldmatrix.sync.aligned.m8n8.x4.shared.b16").count(), 16, "`{kernel}`: ldmatrix of A");
        assert_eq!(text.matches("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16").count(), 8, "`{kernel}`: ldmatrix.trans of B");
        assert_eq!(text.matches("cp.async.cg.shared.global").count(), 3 * 8, "`{kernel}`: cp.async copies");
        assert!(text.contains("cp.async.wait_group 1;") && text.contains("cp.async.commit_group;"), "`{kernel}`: pipeline waits");
        assert!(!text.contains(".local"), "`{kernel}` keeps its accumulators in local memory");
    }
}


#[test]
fn gemm_sass_has_hmma_ldsm_and_ldgsts() {
    let sass = sass_of_library();
    for (kernel, t) in gemm_kernels() {
        let sass = sass(&kernel);
        let hmma = format!("HMMA.16816.F32{}", if t == "bf16" { ".BF16" } else { " " });
        assert_eq!(sass.matches(&hmma).count(), 64, "`{kernel}`: {hmma} per k-step");
        assert!(sass.contains("LDSM.16.M88.4") && sass.contains("LDSM.16.MT88.4"), "`{kernel}` lacks LDSM");
        assert!(sass.contains("LDGSTS.E.BYPASS.128"), "`{kernel}` lacks 16-byte LDGSTS");
        assert!(!sass.contains("LDL") && !sass.contains("STL"), "`{kernel}` touches local memory");
    }
}

/// The wgmma GEMM kernels, as (name, input type).
const WGMMA_KERNELS: [(&str, &str); 10] = [
    ("wgmma_bf16", "bf16"),
    ("wgmma_bf16_bias", "bf16"),
    ("wgmma_bf16_bias_gelu", "bf16"),
    ("wgmma_bf16_residual", "bf16"),
    ("wgmma_bf16_scale", "bf16"),
    ("wgmma_f16", "f16"),
    ("wgmma_f16_bias", "f16"),
    ("wgmma_f16_bias_gelu", "f16"),
    ("wgmma_f16_residual", "f16"),
    ("wgmma_f16_scale", "f16"),
];

/// BERT's batch-1 attention stages Q, K and V by TMA boxes landing on one mbarrier, not by
/// `cp.async` of 16 bytes a thread (10 µs a pass slower).
#[test]
fn split_attention_stages_by_tma() {
    let text = entry("attention_split");
    for instruction in ["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes", "mbarrier.try_wait", "ldmatrix.sync.aligned"] {
        assert!(text.contains(instruction), "`attention_split` lacks `{instruction}`");
    }
    assert!(!text.contains("cp.async.cg"), "`attention_split` stages by `cp.async`");
}

#[test]
fn split_k_wgmma_gemm_uses_tma_and_wgmma_m64n64() {
    for kernel in [
        "wgmma_split_f16",
        "wgmma_split_f16_bias",
        "wgmma_split_f16_bias_gelu",
        "wgmma_split_f16_residual",
        "wgmma_split_f16_folded_ln_bias",
        "wgmma_split_f16_folded_ln_bias_gelu",
        "wgmma_split_f16_residual_stats",
        "wgmma_split_f16_ln_residual_stats",
    ] {
        let text = entry(kernel);
        assert!(text.contains(".maxntid 384, 1, 1") && text.contains(".minnctapersm 1"), "`{kernel}`: launch bounds");
        for instruction in [
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16",
            "wgmma.wait_group.sync.aligned 1",
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
            "griddepcontrol.wait",
            "mapa",
        ] {
            assert!(text.contains(instruction), "`{kernel}` lacks `{instruction}`");
        }
        assert!(!text.contains("setmaxnreg"), "`{kernel}`: one tile a block needs no register split");
    }
}

/// The split-K row kernels whose epilogue adds a residual read their peers' partial tiles as
/// f16, four columns in one 8-byte DSMEM load (half the bytes, which bound that phase:
/// `results/bert-h200.md`, session 16); those that fold a LayerNorm into the product, whose
/// epilogue cancels the mean's share, as f32, four in one 16-byte load.
#[test]
fn split_k_row_kernels_exchange_f16_partials_unless_they_cancel() {
    for kernel in ["wgmma_split_f16_residual_stats", "wgmma_split_f16_ln_residual_stats"] {
        let text = entry(kernel);
        assert!(text.contains("cvt.rn.f16x2.f32"), "`{kernel}`: the partial tile is not rounded to f16x2");
        assert!(text.contains("ld.shared::cluster.b64") && !text.contains("ld.shared::cluster.v4"), "`{kernel}`: peers' partials are not read as 8-byte f16 quads");
    }
    for kernel in ["wgmma_split_f16_folded_ln_bias", "wgmma_split_f16_folded_ln_bias_gelu"] {
        let text = entry(kernel);
        assert!(text.contains("ld.shared::cluster.v4.b32") && !text.contains("ld.shared::cluster.b64"), "`{kernel}`: peers' partials are not read as f32 quads");
    }
}

/// BERT's batch-1 pass leaves room on each SM for one projection block and the next kernel's
/// (`split_k_config`): shared memory would fit two projection blocks, registers must not. The
/// split-K kernels it takes after its first layer hold this only while they use more than 80
/// registers a thread; a change that drops one below lets two of its blocks share an SM,
/// which ran the pass at 1.2-1.7× the time (`results/bert-h200.md`). (The first layer's O,
/// `wgmma_split_f16_residual_stats`, fell to 71 registers with its f16 partials in session 16;
/// the pass was timed so.)
#[test]
fn bert_batch_1_projections_take_an_sm_each_by_registers() {
    use clusterfuse::limits::{REGISTERS_PER_SM, REGISTER_ALLOCATION_UNIT};
    let (kernels, _) = resources_and_report();
    for kernel in ["wgmma_split_f16_folded_ln_bias", "wgmma_split_f16_folded_ln_bias_gelu", "wgmma_split_f16_ln_residual_stats"] {
        let registers = kernels[kernel].registers.next_multiple_of(REGISTER_ALLOCATION_UNIT);
        assert!(
            2 * clusterfuse_kernels::wgmma_gemm::THREADS as u32 * registers > REGISTERS_PER_SM,
            "`{kernel}`: two blocks of {:?} fit one SM's registers",
            kernels[kernel]
        );
    }
}

/// The deferred LayerNorms: no kernel waits for another cluster (no atomics, no device-wide
/// fence), and the split-K kernels that read a row a half-warp at a time end with a relaxed
/// cluster arrival; those that fold a LayerNorm into their product read A as TMA loads it
/// (nothing rewrites a stage: no generic-to-async proxy fence).
#[test]
fn deferred_layer_norm_kernels_wait_for_no_other_cluster() {
    for kernel in ["wgmma_split_f16_folded_ln_bias", "wgmma_split_f16_folded_ln_bias_gelu", "wgmma_split_f16_residual_stats", "wgmma_split_f16_ln_residual_stats"] {
        let text = entry(kernel);
        assert!(text.contains("barrier.cluster.arrive.relaxed"), "`{kernel}` lacks its relaxed closing arrival");
        assert!(!text.contains("atom.") && !text.contains("fence.acq_rel.gpu"), "`{kernel}` waits for other clusters");
        assert!(!text.contains("fence.proxy.async"), "`{kernel}` rewrites shared memory that wgmma reads");
    }
}

#[test]
fn wgmma_gemm_uses_tma_wgmma_and_setmaxnreg() {
    for (kernel, t) in WGMMA_KERNELS {
        let text = entry(kernel);
        assert!(text.contains(".maxntid 384, 1, 1"), "`{kernel}`: launch bound");
        let mma = format!("wgmma.mma_async.sync.aligned.m64n256k16.f32.{t}.{t}");
        for instruction in [
            mma.as_str(),
            "wgmma.fence.sync.aligned",
            "wgmma.commit_group.sync.aligned",
            "wgmma.wait_group.sync.aligned 0",
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
            "mbarrier.arrive.expect_tx",
            "mbarrier.arrive.release.cta.shared::cta.b64",
            "setmaxnreg.dec.sync.aligned.u32 40",
            "setmaxnreg.inc.sync.aligned.u32 232",
        ] {
            assert!(text.contains(instruction), "`{kernel}` lacks `{instruction}`");
        }
        assert!(!text.contains(".local"), "`{kernel}` keeps its accumulators in local memory");
    }
    // 384 threads at 168 registers fill the SM's 64 K; setmaxnreg moves them to the consumers.
    let (kernels, report) = resources_and_report();
    assert!(!report.contains("C7515"), "ptxas serialises wgmma: {}", report.lines().filter(|l| l.contains("C7515")).collect::<Vec<_>>().join("\n"));
    for (kernel, _) in WGMMA_KERNELS {
        assert!(kernels[kernel].registers <= 168, "`{kernel}`: {:?}", kernels[kernel]);
    }
}

#[test]
fn wgmma_gemm_sass_has_hgmma_and_utmaldg() {
    let sass = sass_of_library();
    for (kernel, t) in WGMMA_KERNELS {
        let sass = sass(kernel);
        // Four m64n256k16 per k-step of 64, and the two tile loads.
        let hgmma = format!("HGMMA.64x256x16.F32{}", if t == "bf16" { ".BF16" } else { " " });
        assert_eq!(sass.matches(&hgmma).count(), 4, "`{kernel}`: HGMMA per k-step");
        assert!(sass.contains("UTMALDG.2D"), "`{kernel}` lacks TMA loads (UTMALDG)");
        assert!(sass.contains("USETMAXREG"), "`{kernel}` lacks setmaxnreg");
        assert!(!sass.contains("LDL") && !sass.contains("STL"), "`{kernel}` touches local memory");
    }
}

/// A tile inside C takes the unchecked epilogue: after the last wgmma, one branch (to the
/// checked path at C's edges), then the thread's 64 paired stores with no branch between
/// them, and no scalar 2-byte loads; the bias is read in 32 4-byte loads before the tile's
/// main loop, the residual in 4-byte loads among the stores.
#[test]
fn wgmma_gemm_epilogue_is_straight_line() {
    let sass = sass_of_library();
    for (kernel, _) in WGMMA_KERNELS {
        let sass = sass(kernel);
        let lines: Vec<&str> = sass.lines().collect();
        let last_mma = lines.iter().position(|l| l.contains("WARPGROUP.DEPBAR.LE gsb0, 0x0")).expect("a final wgmma wait");
        let after = &lines[last_mma..];
        let choice = after.iter().position(|l| l.contains("BRA")).expect("the branch to the checked path");
        let fast = &after[choice + 1..];
        let stores = fast.iter().take_while(|l| !l.contains("BRA")).filter(|l| l.contains("STG.E ")).count();
        assert_eq!(stores, 64, "`{kernel}`: paired stores before the next branch");
        let loads = fast.iter().take_while(|l| !l.contains("BRA")).filter(|l| l.contains("LDG")).count();
        assert_eq!(loads, if kernel.ends_with("residual") { 64 } else { 0 }, "`{kernel}`: loads in the unchecked epilogue");
        let prefetch = lines[..last_mma].iter().filter(|l| l.contains("LDG.E ")).count();
        let bias = kernel.ends_with("bias") || kernel.ends_with("bias_gelu");
        assert!(!bias || prefetch >= 32, "`{kernel}`: {prefetch} 4-byte loads before the main loop's end");
    }
}
