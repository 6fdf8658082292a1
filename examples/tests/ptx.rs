//! The examples' PTX, checked without a GPU: launch directives in place, shared memory through
//! `ld.shared`/`st.shared`, DSMEM through 16-byte `ld/st.shared::cluster.v4`, and every kernel
//! assembled by `ptxas -arch=sm_90a` with no spills and the shared memory it should use (a
//! `#[cluster_primitive]`'s scratch included). The kernel library's PTX (GEMMs, norms, BERT,
//! decode, Llama, MoE) is checked in `kernels/tests/`.

use clusterfuse_build::KernelResources;
use clusterfuse_examples::__CLUSTERFUSE_PTX as PTX;
use std::collections::BTreeMap;

/// The text of one `.entry`, from its header to its closing brace.
fn entry(name: &str) -> &'static str {
    clusterfuse_build::entry(PTX.text, name).unwrap_or_else(|| panic!("no entry `{name}` in the PTX"))
}

/// Every kernel's resources, from ptxas.
fn resources() -> BTreeMap<String, KernelResources> {
    clusterfuse_build::resources(PTX.text).unwrap_or_else(|e| panic!("{e}")).0
}

#[test]
fn targets_sm_90_with_ptx_8() {
    assert!(PTX.text.contains(".target sm_90"), "PTX does not target sm_90");
    let version = PTX.text.lines().find_map(|l| l.strip_prefix(".version ")).expect(".version line");
    let (major, _) = version.trim().split_once('.').unwrap();
    assert!(major.parse::<u32>().unwrap() >= 8, "PTX ISA {version} < 8.0");
}

#[test]
fn launch_bounds_become_directives() {
    let saxpy = entry("saxpy");
    assert!(saxpy.contains(".maxntid 256, 1, 1") && saxpy.contains(".minnctapersm 2"), "{saxpy}");
    assert!(!entry("empty").contains(".maxntid"));
}

#[test]
fn shared_memory_uses_shared_instructions() {
    for kernel in ["block_sum", "stencil"] {
        let text = entry(kernel);
        assert!(text.contains("st.shared.") && text.contains("ld.shared."), "`{kernel}` does not use ld/st.shared");
    }
}

#[test]
fn cluster_collectives_use_dsmem() {
    for kernel in ["cluster_reduce", "cluster_gather"] {
        let text = entry(kernel);
        for instruction in ["mapa.shared::cluster", "st.shared::cluster", "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire"] {
            assert!(text.contains(instruction), "`{kernel}` lacks `{instruction}`");
        }
    }
    assert!(entry("cluster_reduce").contains("ld.shared::cluster"));
    let bulk = entry("cluster_gather_bulk");
    for instruction in ["fence.proxy.async.shared::cta", "mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster", "mbarrier.arrive.expect_tx", "mbarrier.try_wait.parity", "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes"] {
        assert!(bulk.contains(instruction), "`cluster_gather_bulk` lacks `{instruction}`");
    }
}

#[test]
fn cluster_reduce_moves_16_byte_vectors() {
    for kernel in ["cluster_reduce", "reduce_f32", "reduce_f16", "reduce_bf16", "reduce_i32", "bench_reduce"] {
        let text = entry(kernel);
        for instruction in ["ld.shared::cluster.v4.b32", "st.shared::cluster.v4.b32"] {
            assert!(text.contains(instruction), "`{kernel}` lacks `{instruction}`");
        }
    }
    let naive = entry("bench_reduce_naive");
    assert!(naive.contains("ld.shared::cluster.b32") && !naive.contains("ld.shared::cluster.v4"), "the naive baseline must load scalars");
    assert!(entry("bench_reduce_global").contains("ld.global.v4.b32"), "the global baseline must load 16 bytes, coherently");
    assert!(entry("bench_dsmem_read").contains("ld.shared::cluster.v4.b32"));
    let gather = entry("bench_gather");
    for instruction in ["st.shared::cluster.v4.b32", "ld.shared::cluster.v4.b32", "cp.async.bulk.shared::cluster.shared::cta"] {
        assert!(gather.contains(instruction), "`bench_gather` lacks `{instruction}`");
    }
    assert!(entry("bench_barrier").contains("barrier.cluster.arrive.relaxed"));
}

#[test]
fn every_kernel_assembles_without_spills() {
    let kernels = resources();
    let argmax_scratch = clusterfuse_examples::cluster_primitive::argmax::FACTS.shared_bytes as u32;
    let expected_smem = [
        ("empty", 0),
        ("saxpy", 0),
        ("block_sum", 128),
        ("stencil", 0),
        ("cluster_reduce", 0),
        ("cluster_gather", 0),
        ("reduce_f32", 0),
        ("gather_f32", 0),
        ("reduce_f16", 0),
        ("gather_f16", 0),
        ("reduce_bf16", 0),
        ("gather_bf16", 0),
        ("reduce_i32", 0),
        ("gather_i32", 0),
        ("cluster_argmax", argmax_scratch),
        ("bench_reduce", 0),
        ("bench_reduce_global", 0),
        ("bench_reduce_naive", 0),
        ("bench_barrier", 0),
        ("bench_dsmem_read", 0),
        ("bench_gather", 0),
        ("bench_spin", 0),
        ("reverse", 1024),
        ("warpgroup_reverse", 512),
        ("divergent_barrier", 0),
        ("shared_index", 256),
        ("dynamic_take", 0),
        ("peer_read", 16),
        ("bulk_exchange", 0),
        ("mailbox_exchange", 0),
        ("bulk_stream", 0),
        ("cluster_gather_bulk", 0),
        ("cluster_sum_values", 192),
        ("mma_tile", 3 * 512),
        ("tma_box", 0),
        ("tma_box_peer", 0),
        ("published_chain", 0),
    ];
    assert_eq!(kernels.len(), expected_smem.len(), "kernels: {:?}", kernels.keys());
    for (name, smem) in expected_smem {
        let r = &kernels[name];
        assert_eq!((r.spill_store_bytes, r.spill_load_bytes, r.stack_frame_bytes), (0, 0, 0), "`{name}` spills: {r:?}");
        assert_eq!(r.static_smem_bytes, smem, "`{name}` static shared memory: {r:?}");
    }
    assert_eq!(kernels["block_sum"].barriers, 1);
    assert_eq!(argmax_scratch, 48 * 8, "argmax declares `shared(scratch: [u64; 48])`");
}

#[test]
fn mma_tile_loads_fragments_by_ldmatrix() {
    let tile = entry("mma_tile");
    for instruction in ["ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16", "ldmatrix.sync.aligned.m8n8.x2.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"] {
        assert!(tile.contains(instruction), "`mma_tile` lacks `{instruction}`");
    }
}

/// The examples assembled for sm_90a, and a function disassembling one kernel's SASS.
fn sass_of_examples() -> impl Fn(&str) -> String {
    let sass = clusterfuse_build::Sass::new(PTX.cubin).unwrap_or_else(|e| panic!("{e}"));
    move |kernel: &str| sass.of(kernel).unwrap_or_else(|e| panic!("{e}"))
}

/// `cluster::reduce` sums a vector's peers four at a time: the four 16-byte DSMEM loads
/// (`LD.E.128`) must all go out before the first is used. With a bounds check between them,
/// ptxas put the first value's adds ahead of the other three loads, which then waited a DSMEM
/// round trip for it (clusters of 4-16: 9-22% slower, `results/clusters-h200.md`). Checked
/// where it is measured (`cluster-bench`) and in example 05; ptxas schedules each kernel on its
/// own, and in example 06's kernels, which pick the operation at run time, it still uses the
/// first value after two loads.
#[test]
fn cluster_reduce_issues_four_dsmem_loads_before_using_one() {
    let sass = sass_of_examples();
    for kernel in ["cluster_reduce", "bench_reduce"] {
        assert!(four_loads_in_flight(&sass(kernel)), "`{kernel}`: no four `LD.E.128` in flight before the first is used");
    }
}

/// Whether the SASS has four `LD.E.128` such that nothing between the first and the fourth
/// names the first's four destination registers.
fn four_loads_in_flight(sass: &str) -> bool {
    let instructions: Vec<&str> = sass.lines().filter_map(|line| line.split_once("*/").map(|(_, rest)| rest.trim())).filter(|i| !i.is_empty() && !i.starts_with("/*")).collect();
    let loads: Vec<usize> = (0..instructions.len()).filter(|&i| instructions[i].starts_with("LD.E.128 ")).collect();
    loads.windows(4).any(|group| {
        let first: u32 = instructions[group[0]]["LD.E.128 R".len()..].split(',').next().and_then(|r| r.parse().ok()).unwrap_or(u32::MAX);
        let names_first = |instruction: &str| {
            instruction.split(|c: char| !c.is_ascii_alphanumeric()).any(|token| token.strip_prefix('R').and_then(|r| r.parse::<u32>().ok()).is_some_and(|r| (first..first + 4).contains(&r)))
        };
        (group[0] + 1..group[3]).all(|i| instructions[i].starts_with("LD.E.128 ") || !names_first(instructions[i]))
    })
}
