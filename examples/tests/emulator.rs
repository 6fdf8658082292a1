//! The CPU emulator runs every example against its reference, and reports each bug of the
//! `faults` kernels (a race, a deadlock, an out-of-bounds access, a read of an exited peer's
//! shared memory, a panic) with the kernel, block and thread, while passing their fixes.

use clusterfuse::host::{Error, Gpu, LaunchConfig, Published};
use clusterfuse::Dim3;
use clusterfuse_examples::faults::{bulk_exchange, divergent_barrier, dynamic_take, mailbox_exchange, peer_read, published_chain, reverse, shared_index, warpgroup_reverse, CHAIN_TILE};
use clusterfuse_examples::{saxpy::saxpy, EXAMPLES};

fn config(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig { grid: grid.into(), block: block.into(), ..LaunchConfig::default() }
}

/// The fault an emulated launch must have reported.
fn fault(result: clusterfuse::host::Result<()>) -> clusterfuse::emu::Fault {
    match result {
        Err(Error::Emulator(fault)) => fault,
        other => panic!("expected an emulator fault, got {other:?}"),
    }
}

#[test]
fn examples_match_their_references_on_the_emulator() {
    let gpu = Gpu::emulator();
    for (name, run) in EXAMPLES {
        let report = run(&gpu).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(report.passed(), "{name}: {report:?}");
    }
}

#[test]
fn a_missing_barrier_is_reported_as_a_race() {
    let gpu = Gpu::emulator();
    let kernel = reverse::load(&gpu).unwrap();
    let x: Vec<f32> = (0..512).map(|i| i as f32).collect();
    let dx = gpu.upload(&x).unwrap();
    let mut out = gpu.zeros::<f32>(512).unwrap();

    kernel.launch(gpu.stream(), &config(2, 256), &dx, &mut out, 1).unwrap();
    let expected: Vec<f32> = x.chunks(256).flat_map(|c| c.iter().rev().copied()).collect();
    assert_eq!(gpu.download(&out).unwrap(), expected);

    let fault = fault(kernel.launch(gpu.stream(), &config(2, 256), &dx, &mut out, 0));
    assert_eq!(fault.kernel, "reverse");
    assert!(fault.message.contains("shared-memory race"), "{fault}");
    assert!(fault.message.contains("no barrier between them"), "{fault}");
}

#[test]
fn a_warpgroup_barrier_orders_its_own_threads_alone() {
    let gpu = Gpu::emulator();
    let kernel = warpgroup_reverse::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(256).unwrap();
    // Warpgroup 0 has exited: a block barrier would never complete, the warpgroup's does.
    kernel.launch(gpu.stream(), &config(2, 256), &mut out, 1).unwrap();
    let expected: Vec<f32> = (0..256).map(|i| (127 - i % 128) as f32).collect();
    assert_eq!(gpu.download(&out).unwrap(), expected);

    let fault = fault(kernel.launch(gpu.stream(), &config(2, 256), &mut out, 0));
    assert!(fault.message.contains("shared-memory race"), "{fault}");
}

#[test]
fn a_barrier_some_threads_never_reach_is_a_deadlock() {
    let gpu = Gpu::emulator();
    let kernel = divergent_barrier::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(64).unwrap();
    kernel.launch(gpu.stream(), &config(2, 32), &mut out, 32).unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|&v| v == 1.0));

    let fault = fault(kernel.launch(gpu.stream(), &config(2, 32), &mut out, 16));
    assert_eq!(fault.at, None);
    assert!(fault.message.starts_with("deadlock"), "{fault}");
    assert!(fault.message.contains("16 thread(s) wait at bar.sync"), "{fault}");
    assert!(fault.message.contains("16 thread(s) exited"), "{fault}");
}

#[test]
fn out_of_bounds_shared_access_names_block_and_thread() {
    let gpu = Gpu::emulator();
    let kernel = shared_index::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(1).unwrap();
    kernel.launch(gpu.stream(), &config(3, 32), &mut out, 0).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), [1.0]);

    let fault = fault(kernel.launch(gpu.stream(), &config(3, 32), &mut out, 64));
    assert!(fault.message.contains("out-of-bounds"), "{fault}");
    assert_eq!(fault.at.map(|(_, thread)| thread), Some(Dim3::new(0, 0, 0)));
}

#[test]
fn dynamic_shared_memory_past_4_gib_of_bytes_is_refused() {
    let gpu = Gpu::emulator();
    let kernel = dynamic_take::load(&gpu).unwrap();
    let mut out = gpu.zeros::<u32>(1).unwrap();
    let config = LaunchConfig { dynamic_smem_bytes: 64, ..config(1, 32) };
    kernel.launch(gpu.stream(), &config, &mut out, 16).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), [16]);
    // 2^30 + 1 values are 2^32 + 4 bytes: 4 once truncated to 32 bits.
    let fault = fault(kernel.launch(gpu.stream(), &config, &mut out, (1 << 30) + 1));
    assert!(fault.message.contains("out-of-bounds"), "{fault}");
}

#[test]
fn reading_an_exited_peer_is_reported() {
    let gpu = Gpu::emulator();
    let kernel = peer_read::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(1).unwrap();
    kernel.launch(gpu.stream(), &config(2, 32), &mut out, 1, 1).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), [2.0]);

    let fault = fault(kernel.launch(gpu.stream(), &config(2, 32), &mut out, 0, 1));
    assert!(fault.message.contains("which has exited"), "{fault}");
    assert_eq!(fault.at, Some((Dim3::new(0, 0, 0), Dim3::new(0, 0, 0))));
}

#[test]
fn reaching_a_peer_before_any_cluster_barrier_is_reported() {
    let gpu = Gpu::emulator();
    let kernel = peer_read::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(1).unwrap();
    let fault = fault(kernel.launch(gpu.stream(), &config(2, 32), &mut out, 1, 0));
    assert!(fault.message.contains("may not have started"), "{fault}");
    assert_eq!(fault.at, Some((Dim3::new(0, 0, 0), Dim3::new(0, 0, 0))));
}

#[test]
fn a_panic_in_a_kernel_names_its_thread() {
    let gpu = Gpu::emulator();
    let kernel = saxpy::load(&gpu).unwrap();
    let x = gpu.upload(&[1.0f32; 100]).unwrap();
    let mut y = gpu.zeros::<f32>(300).unwrap();
    let fault = fault(kernel.launch(gpu.stream(), &config(2, 256), 2.0, &x, &mut y));
    assert!(fault.message.contains("index out of bounds"), "{fault}");
    let (block, thread) = fault.at.unwrap();
    assert!(block.x * 256 + thread.x >= 100, "{fault}");
}

#[test]
fn the_emulator_plans_launches_like_a_gpu() {
    let emulator = Gpu::emulator();
    let kernel = saxpy::load(&emulator).unwrap();
    let x = emulator.upload(&[1.0f32; 4]).unwrap();
    let mut y = emulator.zeros::<f32>(4).unwrap();
    // The launch configuration is checked as for a GPU before anything runs.
    kernel.launch(emulator.stream(), &config(1, 32), 1.0, &x, &mut y).unwrap();
    let too_big = config(1, 2048);
    assert!(matches!(kernel.launch(emulator.stream(), &too_big, 1.0, &x, &mut y), Err(Error::InvalidLaunch { .. })));
}

#[test]
fn reading_a_bulk_copy_before_its_mbarrier_wait_is_a_race() {
    let gpu = Gpu::emulator();
    let kernel = bulk_exchange::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(8).unwrap();
    let config = LaunchConfig { dynamic_smem_bytes: 48, ..config(2, 32) };
    kernel.launch(gpu.stream(), &config, &mut out, 1).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), [4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0]);

    // Whichever side the scheduler runs first reports it: the early read, or the copy
    // landing on bytes read without waiting.
    let fault = fault(kernel.launch(gpu.stream(), &config, &mut out, 0));
    assert!(fault.message.contains("shared-memory race"), "{fault}");
}

#[test]
fn a_mailbox_keeps_its_block_until_its_words_land_and_exiting_first_is_reported() {
    let gpu = Gpu::emulator();
    let kernel = mailbox_exchange::load(&gpu).unwrap();
    let mut out = gpu.zeros::<f32>(8).unwrap();
    let config = LaunchConfig { dynamic_smem_bytes: 48, ..config(2, 32) };
    kernel.launch(gpu.stream(), &config, &mut out, 4, 1).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), [4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0]);

    // Expecting 8 words of the 4 sent, the phase never completes: the block exits with its
    // peer's words in flight (or before they are sent).
    let fault = fault(kernel.launch(gpu.stream(), &config, &mut out, 8, 0));
    assert!(fault.message.contains("exited"), "{fault}");
}

#[test]
fn a_ring_of_global_bulk_copies_streams_exactly_and_reading_early_is_a_race() {
    use clusterfuse_examples::faults::{bulk_stream, STREAM_STAGES};
    let gpu = Gpu::emulator();
    let kernel = bulk_stream::load(&gpu).unwrap();
    // 2 warps × 5 chunks of 32: more chunks than stages, so every stage is reused.
    let values: Vec<f32> = (0..320).map(|i| i as f32 - 100.0).collect();
    let x = gpu.upload(&values).unwrap();
    let mut out = gpu.zeros::<f32>(320).unwrap();
    let config = LaunchConfig { dynamic_smem_bytes: 2 * (128 + 16) * STREAM_STAGES as u32, ..config(1, 64) };
    kernel.launch(gpu.stream(), &config, &x, &mut out, 1).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), values.iter().map(|v| 2.0 * v).collect::<Vec<_>>());
    let fault = fault(kernel.launch(gpu.stream(), &config, &x, &mut out, 0));
    assert!(fault.message.contains("shared-memory race"), "{fault}");
}

#[test]
fn gemm_rejects_unsupported_shapes_before_launching() {
    use clusterfuse::f16;
    use clusterfuse_kernels::gemm::{config, EpilogueKind, GemmError, GemmType, HostOperands, Operands};
    for (m, n, k, what) in [(33, 40, 50, "multiples of 8"), (33, 44, 48, "multiples of 8"), (0, 8, 8, "at least 1")] {
        match config(m, n, k) {
            Err(err @ GemmError::Shape(_)) => assert!(err.to_string().contains(what), "{m} × {n} × {k}: {err}"),
            other => panic!("{m} × {n} × {k} accepted: {other:?}"),
        }
    }
    assert!(config(33, 40, 48).is_ok());

    let gpu = Gpu::emulator();
    let kernels = f16::load(&gpu).unwrap();
    let x = Operands::upload(&gpu, &HostOperands::<f16>::random(&mut rand::rng(), 16, 16, 16)).unwrap();
    let mut out = gpu.upload(&[f16::NAN; 255]).unwrap();
    let err = f16::launch(&kernels, &gpu, EpilogueKind::None, &x, &mut out, 16, 16, 16).unwrap_err();
    assert!(err.to_string().contains("C holds 255 elements"), "{err}");
    // Nothing was launched: the output still holds its poison.
    assert!(gpu.download(&out).unwrap().iter().all(|v| v.is_nan()));
    let err = f16::launch(&kernels, &gpu, EpilogueKind::Residual, &x, &mut gpu.upload(&[f16::NAN; 256]).unwrap(), 16, 16, 16);
    assert!(err.is_ok(), "{err:?}");
}

#[test]
fn reading_a_tma_tile_before_its_mbarrier_wait_is_a_race() {
    use clusterfuse::bf16;
    use clusterfuse::host::Swizzle;
    use clusterfuse_examples::wgmma_gemm::{tma_box, TMA_BOX_SMEM};
    let gpu = Gpu::emulator();
    let tensor = gpu.upload(&[bf16::from_f32(1.0); 8 * 64]).unwrap();
    let map = gpu.tensor_map_2d(&tensor, (8, 64), (8, 64), Swizzle::B128).unwrap();
    let mut out = gpu.upload(&[bf16::NAN; 512]).unwrap();
    let config = LaunchConfig { dynamic_smem_bytes: TMA_BOX_SMEM, ..config(1, 128) };
    let kernel = tma_box::load(&gpu).unwrap();
    kernel.launch(gpu.stream(), &config, map.words(), &mut out, 0, 0, 1).unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|v| v.to_f32() == 1.0));
    let fault = fault(kernel.launch(gpu.stream(), &config, map.words(), &mut out, 0, 0, 0));
    assert!(fault.message.contains("shared-memory race") && fault.message.contains("bulk copy"), "{fault}");
}

#[test]
fn a_tma_load_into_a_peers_shared_memory_lands_there() {
    use clusterfuse::bf16;
    use clusterfuse::host::Swizzle;
    use clusterfuse::Dim3;
    use clusterfuse_examples::wgmma_gemm::{tma_box_peer, TMA_BOX_SMEM};
    let gpu = Gpu::emulator();
    let x: Vec<bf16> = (0..8 * 64).map(|i| bf16::from_f32(i as f32)).collect();
    let tensor = gpu.upload(&x).unwrap();
    let map = gpu.tensor_map_2d(&tensor, (8, 64), (8, 64), Swizzle::B128).unwrap();
    let mut out = gpu.upload(&[bf16::NAN; 512]).unwrap();
    let config = LaunchConfig { cluster: Some(Dim3::new(2, 1, 1)), dynamic_smem_bytes: TMA_BOX_SMEM, ..config(2, 128) };
    tma_box_peer::load(&gpu).unwrap().launch(gpu.stream(), &config, map.words(), &mut out, 0, 0).unwrap();
    assert_eq!(gpu.download(&out).unwrap(), x);
}

#[test]
fn wgmma_gemm_rejects_unsupported_shapes_before_launching() {
    use clusterfuse::bf16;
    use clusterfuse::host::Swizzle;
    use clusterfuse_kernels::gemm::{EpilogueKind, GemmError, HostOperands, Operands};
    use clusterfuse_kernels::wgmma_gemm::{config, split_k_config, Kernels, Maps, SmLayout};
    for (m, n, k, what) in [(33, 40, 50, "multiple of 8"), (0, 8, 8, "at least 1")] {
        match config(m, n, k, 132) {
            Err(err @ GemmError::Shape(_)) => assert!(err.to_string().contains(what), "{m} × {n} × {k}: {err}"),
            other => panic!("{m} × {n} × {k} accepted: {other:?}"),
        }
    }
    // Any M and N: TMA zero-fills the edges, the stores are masked. At most a block per SM.
    assert_eq!(config(33, 41, 48, 132).unwrap().grid.x, 1);
    assert_eq!(config(4096, 4096, 48, 132).unwrap().grid.x, 132);
    // Split-K: at most `max_splits` blocks a tile, and at least one.
    let even = SmLayout::uniform(132);
    assert_eq!(split_k_config(128, 768, 3072, &even, 6).unwrap().grid.z, 6);
    assert_eq!(split_k_config(128, 768, 3072, &even, 1).unwrap().grid.z, 1);
    // The waves of clusters decide: on the H200's counts (`bert-bench`), 24 tiles take 4
    // blocks each, not 5 (22 clusters of 5 fit: two waves), where 132 even SMs would take 5;
    // 192 tiles of 48 k-steps take 2 in three waves rather than 1 in two.
    let h200 = SmLayout::new([132, 66, 39, 30, 22, 17, 15, 15]);
    assert_eq!(split_k_config(256, 768, 3072, &h200, 6).unwrap().grid.z, 4);
    assert_eq!(split_k_config(256, 768, 3072, &even, 6).unwrap().grid.z, 5);
    assert_eq!(split_k_config(2048, 768, 3072, &h200, 6).unwrap().grid.z, 2);
    assert_eq!(split_k_config(128, 2304, 768, &h200, 6).unwrap().grid.z, 3);
    match split_k_config(128, 768, 3072, &even, 0) {
        Err(err @ GemmError::Shape(_)) => assert!(err.to_string().contains("max_splits is 0"), "{err}"),
        other => panic!("max_splits = 0 accepted: {other:?}"),
    }

    let gpu = Gpu::emulator();
    let x = Operands::upload(&gpu, &HostOperands::<bf16>::random(&mut rand::rng(), 16, 16, 16)).unwrap();
    let err = gpu.tensor_map_2d(&x.a, (16, 20), (8, 8), Swizzle::B128).err().expect("rows of 40 bytes");
    assert!(err.to_string().contains("multiple of 16 bytes"), "{err}");
    let err = gpu.tensor_map_2d(&x.a, (16, 16), (8, 128), Swizzle::B128).err().expect("a 256-byte box row");
    assert!(err.to_string().contains("at most 128 bytes"), "{err}");
    let maps = Maps::new(&gpu, &x.a, &x.b, (16, 16, 16)).unwrap();
    let mut out = gpu.upload(&[bf16::NAN; 255]).unwrap();
    let err = Kernels::load(&gpu).unwrap().launch(&gpu, EpilogueKind::None, &maps, &x, &mut out, (16, 16, 16)).unwrap_err();
    assert!(err.to_string().contains("C holds 255 elements"), "{err}");
    assert!(gpu.download(&out).unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn tensor_core_ops_need_the_whole_warp() {
    use clusterfuse::bf16;
    use clusterfuse_examples::gemm::mma_tile;
    let gpu = Gpu::emulator();
    let (a, c) = (gpu.upload(&[bf16::ONE; 256]).unwrap(), gpu.upload(&[0.0f32; 256]).unwrap());
    let mut out = gpu.zeros::<f32>(512).unwrap();
    let kernel = mma_tile::load(&gpu).unwrap();
    kernel.launch(gpu.stream(), &config(1, 32), &a, &a, &a, &c, &mut out).unwrap();
    assert!(gpu.download(&out).unwrap().iter().all(|&v| v == 16.0));
    let fault = fault(kernel.launch(gpu.stream(), &config(1, 16), &a, &a, &a, &c, &mut out));
    assert!(fault.message.contains("past the end of a warp of 16 threads"), "{fault}");
}

#[test]
fn bert_rejects_sizes_its_kernels_cannot_run() {
    use clusterfuse_kernels::bert::{Dims, BERT_BASE, TINY};
    assert_eq!(BERT_BASE.check(), Ok(()));
    assert_eq!(TINY.check(), Ok(()));
    for (dims, what) in [
        (Dims { heads: 8, ..BERT_BASE }, "not heads 8 × 64"),
        (Dims { hidden: 320, heads: 5, ..BERT_BASE }, "multiple of 256"),
        (Dims { ffn: 3000, ..BERT_BASE }, "ffn 3000"),
        (Dims { seq: 130, ..BERT_BASE }, "seq 130"),
        (Dims { seq: 18, ..BERT_BASE }, "seq 18"),
    ] {
        let err = dims.check().unwrap_err();
        assert!(err.contains(what), "{dims:?}: {err}");
    }
}

/// Also which GEMM each projection takes: the unfused mode example 10's split-K GEMM where
/// example 12's `wgmma` GEMM does not cover the SMs; the fused mode, where no projection takes
/// the `wgmma` GEMM, example 12's split-K kernels for all four with its LayerNorms deferred
/// (5 kernels a layer and one a pass) and its attention splitting its keys over warps — at
/// batch 1 (M = 80) on 8 and 32 SMs, at batch 2 (M = 160, two row tiles) on 32; at batch 2 on
/// 8 SMs (the emulator's default) both modes run QKV and FFN1 on the `wgmma` GEMM, O and FFN2
/// on example 10's (unfused) or example 12's split-K kernels (fused, 7 kernels a layer).
#[test]
fn bert_launches_as_many_kernels_as_its_mode_says() {
    use clusterfuse_kernels::bert::{Batch, Kernels, Mode, Model, TINY};
    use clusterfuse_kernels::wgmma_gemm::SmLayout;
    let gpu = Gpu::emulator();
    let (kernels, model) = (Kernels::load(&gpu).unwrap(), Model::random(&gpu, TINY, rand::random()).unwrap());
    let layers = TINY.layers;
    let split = ["split"; 4];
    for (batch, sms, unfused, fused, fused_kernels) in [
        (1, 8, ["gemm"; 4], split, 5 * layers + 1),
        (1, 32, ["gemm"; 4], split, 5 * layers + 1),
        (2, 8, ["wgmma", "gemm", "wgmma", "gemm"], ["wgmma", "split", "wgmma", "split"], 7 * layers),
        (2, 32, ["gemm"; 4], split, 5 * layers + 1),
    ] {
        let x = vec![clusterfuse::f16::from_f32(0.5); batch * TINY.seq * TINY.hidden];
        for (mode, projections) in Mode::ALL.into_iter().zip([unfused, fused]) {
            let mut b = Batch::for_layout(&gpu, &TINY, batch, &x, &SmLayout::uniform(sms)).unwrap();
            let ((), trace) = gpu.record(mode.name(), Some(batch as u32), || b.forward(gpu.stream(), &kernels, &model, mode)).unwrap();
            let launches = clusterfuse::host::trace::Summary::of(&trace).kernels;
            let expected = if mode == Mode::Fused { fused_kernels } else { 16 * layers };
            assert_eq!((launches, b.kernels(mode, layers)), (expected, expected), "batch {batch}, {sms} SMs, {}", mode.name());
            let gemms: Vec<&str> = trace
                .launches()
                .filter_map(|l| if l.kernel.starts_with("wgmma_split") { Some("split") } else { l.kernel.split('_').next().filter(|k| k.contains("mm")) })
                .collect();
            assert_eq!(gemms, projections.repeat(layers), "batch {batch}, {sms} SMs, {}", mode.name());
            let split_attention = trace.launches().any(|l| l.kernel == "attention_split");
            assert_eq!(split_attention, mode == Mode::Fused && fused == split, "batch {batch}, {}", mode.name());
        }
    }
}

/// The fused mode on example 12's split-K kernels against the f64 reference: with its
/// LayerNorms deferred to the kernels that read their outputs and all four projections split-K
/// (as BERT-base at batch 1-4 on the H200) at batch 1 planned for 8 and 32 SMs (K split over
/// 1-2 and 2-4 blocks) and batch 2 for 32 (two row tiles, the second partial); with O and FFN2
/// alone split-K, each followed by `layer_norm_rows` (as BERT-base at batch 8 and 16), at
/// batch 2 and 3 for 8 (two and three row tiles).
#[test]
fn bert_on_split_k_projections_matches_its_reference() {
    use clusterfuse_examples::bert::check_for_layout;
    use clusterfuse_kernels::bert::TINY;
    use clusterfuse_kernels::wgmma_gemm::SmLayout;
    for (batch, sms) in [(1, 8), (1, 32), (2, 32), (2, 8), (3, 8)] {
        let report = check_for_layout(&Gpu::emulator(), TINY, batch, &SmLayout::uniform(sms)).unwrap();
        assert!(report.passed(), "batch {batch}, {sms} SMs: rel error {:.2e}, tolerance {:.0e}, {} unwritten", report.rel_error, report.tolerance, report.unwritten);
    }
}

/// Example 10's split-K reduction over clusters of 4 and 8 blocks (its own check splits by
/// 2): M = 100 (one partial row tile), K = 512 and 1024 (8 and 16 k-steps), with the
/// residual epilogue, against the f64 reference.
#[test]
fn gemm_split_k_over_4_and_8_blocks_matches_its_reference() {
    use clusterfuse::f16;
    use clusterfuse_examples::check::Report;
    use clusterfuse_kernels::gemm::{config, EpilogueKind, GemmType, HostOperands, Operands, F16_TOLERANCE};
    let gpu = Gpu::emulator();
    let kernels = f16::load(&gpu).unwrap();
    let (m, n, epilogue) = (100, 136, EpilogueKind::Residual);
    for (k, splits) in [(512, 4), (1024, 8)] {
        assert_eq!(config(m, n, k).unwrap().grid.z, splits, "K = {k}");
        let host = HostOperands::<f16>::random(&mut rand::rng(), m, n, k);
        let x = Operands::upload(&gpu, &host).unwrap();
        let mut out = gpu.upload(&vec![f16::NAN; m * n]).unwrap();
        f16::launch(&kernels, &gpu, epilogue, &x, &mut out, m, n, k).unwrap();
        let out: Vec<f32> = gpu.download(&out).unwrap().into_iter().map(f16::to_f32).collect();
        let reference: Vec<f64> = (0..m * n).map(|i| epilogue.reference(host.dot(i / n, i % n, n, k), i / n, i % n, n, &host)).collect();
        let report = Report::new(format!("{m} × {n} × {k}, split {splits}"), &out, &reference, F16_TOLERANCE);
        assert!(report.passed(), "{report:?}");
    }
}

/// The chain's inputs, `y` (published in tiles) and `z`, for `tiles` tiles.
fn chain_buffers(gpu: &Gpu, tiles: usize) -> (Vec<f32>, clusterfuse::host::Buffer<f32>, Published<f32>, clusterfuse::host::Buffer<f32>) {
    let x: Vec<f32> = (0..tiles * CHAIN_TILE).map(|i| (i % 97) as f32 - 40.0).collect();
    let dx = gpu.upload(&x).unwrap();
    let y = Published::new(gpu, gpu.upload(&vec![f32::NAN; x.len()]).unwrap(), CHAIN_TILE as u32).unwrap();
    let z = gpu.upload(&vec![f32::NAN; x.len()]).unwrap();
    (x, dx, y, z)
}

#[test]
fn a_persistent_kernel_waits_for_tiles_other_blocks_publish() {
    let gpu = Gpu::emulator();
    let kernel = published_chain::load(&gpu).unwrap();
    let tiles = 12;
    let (x, dx, mut y, _) = chain_buffers(&gpu, tiles);
    // Three launches: each must find none of its tiles published (the last block of the one
    // before advanced the epoch, which the flags after the tiles hold).
    let epoch = tiles.next_multiple_of(4);
    for launch in 1..=3 {
        let mut z = gpu.upload(&vec![f32::NAN; x.len()]).unwrap();
        kernel.launch(gpu.stream(), &config(5, 128), &dx, &mut y, &mut z, u32::MAX, 0).unwrap();
        let expected: Vec<f32> = (0..x.len()).map(|i| 2.0 * x[(i + CHAIN_TILE) % x.len()] + 1.0).collect();
        assert_eq!(gpu.download(&z).unwrap(), expected);
        let flags = gpu.download(y.flags()).unwrap();
        assert!(flags[..tiles].iter().all(|&f| f == launch), "launch {launch} published {flags:?}");
        assert_eq!(flags[epoch..epoch + 2], [launch, 0], "epoch, retired blocks");
    }
}

#[test]
fn a_thread_waits_alone_for_a_tile_another_block_publishes() {
    let gpu = Gpu::emulator();
    let kernel = published_chain::load(&gpu).unwrap();
    let (x, dx, mut y, mut z) = chain_buffers(&gpu, 12);
    kernel.launch(gpu.stream(), &config(5, 128), &dx, &mut y, &mut z, u32::MAX, 1).unwrap();
    let expected: Vec<f32> = (0..x.len()).map(|i| 2.0 * x[(i + CHAIN_TILE) % x.len()] + 1.0).collect();
    assert_eq!(gpu.download(&z).unwrap(), expected);
    // Never published: every thread of the waiting block spins alone, none at a barrier.
    let (_, dx, mut y, mut z) = chain_buffers(&gpu, 8);
    let fault = fault(kernel.launch(gpu.stream(), &config(4, 128), &dx, &mut y, &mut z, 5, 1));
    assert!(fault.message.contains("block (0, 0, 0): 128 thread(s) spin on words 4..8 of `y (flags)`"), "{fault}");
}

#[test]
fn a_wait_for_a_tile_never_published_is_a_deadlock_naming_the_flag() {
    let gpu = Gpu::emulator();
    let kernel = published_chain::load(&gpu).unwrap();
    let (_, dx, mut y, mut z) = chain_buffers(&gpu, 8);
    let fault = fault(kernel.launch(gpu.stream(), &config(4, 128), &dx, &mut y, &mut z, 5, 0));
    assert_eq!(fault.at, None);
    assert!(fault.message.starts_with("deadlock"), "{fault}");
    // Tile 4 of `z` reads tile 5 of `y`: block 0 takes tiles 0, 4 of 4 blocks.
    assert!(fault.message.contains("block (0, 0, 0): 1 thread(s) spin on words 4..8 of `y (flags)`, which read [1, 0, 1, 1]"), "{fault}");
    assert!(fault.message.contains("127 thread(s) wait at bar.sync"), "{fault}");
}
