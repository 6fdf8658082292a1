//! The library's PTX, checked without a GPU: every kernel assembled by `ptxas -arch=sm_90a`
//! with the shared memory it should use and its spills bounded, the Llama projections'
//! weight loads issued before they wait for the previous kernel, and the attention's merge
//! through DSMEM without atomics.

use clusterfuse_kernels::__CLUSTERFUSE_PTX as PTX;

fn entry(name: &str) -> &'static str {
    clusterfuse_build::entry(PTX.text, name).unwrap_or_else(|| panic!("no entry `{name}` in the PTX"))
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
    ];
    assert_eq!(kernels.len(), expected_smem.len(), "kernels: {:?}", kernels.keys());
    for &(name, smem) in expected_smem {
        let r = &kernels[name];
        if name == "llama_step" {
            // The persistent step's stages spill (results/llama-h200.md): a bound, so that it
            // cannot grow unseen.
            assert!(r.spill_store_bytes <= 768 && r.spill_load_bytes <= 1152 && r.stack_frame_bytes <= 1152, "`{name}` spills: {r:?}");
        } else if name == "llama_qkv" || name == "llama_residual" {
            // The item loop at 128 registers: a few loop-invariant values stored once before
            // it and reloaded once an item (`cuobjdump -sass`), none in the dot products.
            assert!(r.spill_store_bytes <= 32 && r.spill_load_bytes <= 32 && r.stack_frame_bytes <= 48, "`{name}` spills: {r:?}");
        } else {
            assert_eq!((r.spill_store_bytes, r.spill_load_bytes, r.stack_frame_bytes), (0, 0, 0), "`{name}` spills: {r:?}");
        }
        assert_eq!(r.static_smem_bytes, smem, "`{name}` static shared memory: {r:?}");
    }
    // Two blocks of 256 threads per SM, so that the attention's clusters fit beside the QKV
    // kernel's blocks.
    assert!(kernels["llama_attention"].registers <= 128, "{:?}", kernels["llama_attention"]);
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
        assert!(!text.contains("atom."), "`{name}` must not use atomics");
    }
    let text = entry("llama_attention");
    let wait = text.find("griddepcontrol.wait;").expect("the attention waits for the QKV kernel");
    // Cached keys and values (written by the QKV kernels) through the coherent path.
    assert!(text[..wait].contains("ld.global.v4.b32"), "`llama_attention`: no cached k, v load before the wait");
    assert!(text.contains("ld.shared::cluster") && !text.contains("atom."), "`llama_attention`: DSMEM merge, no atomics");
    // The blocks' merge: one barrier to publish their states, one to keep them until read.
    assert_eq!(text.matches("barrier.cluster.arrive").count(), 2, "`llama_attention`: cluster barriers");
}

