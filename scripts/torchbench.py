"""What the PyTorch benchmark scripts share: CUDA-event timing, the copy bandwidth their
rooflines divide by, kernel counting, CUDA-graph capture, relative errors, and the rotate-half
RoPE of both Llama decode scripts."""

import torch


def time_us(calls, warmup, reps, lead_in=True):
    """Median µs per call of `calls` (zero-argument callables run back to back in each pass),
    over `reps` passes timed with CUDA events after `warmup` untimed ones. Each pass is led in
    by its last call, untimed, before the start event (as `median_us_per_call` in
    examples/src/check.rs): where the GPU is the bottleneck, it is then busy when the timed
    calls arrive, and the CPU's latency in submitting the first is not counted. Without the
    lead-in (`median_latency_us`), one call's time is its latency from an idle GPU, its launch
    included."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for rep in range(warmup + reps):
        if lead_in:
            calls[-1]()
        start.record()
        for call in calls:
            call()
        end.record()
        end.synchronize()
        if rep >= warmup:
            samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    samples.sort()
    return samples[len(samples) // 2]


def copy_bandwidth():
    """The card's device-to-device copy bandwidth, bytes read + written per second (1 GiB, the
    median of 20 copies after 5), as `copy_bandwidth` in examples/src/check.rs measures it: the
    rooflines' rate, the card's own rather than a datasheet's."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = time_us([lambda: dst.copy_(src)], 5, 20, lead_in=False)
    bandwidth = 2 * src.numel() / (us * 1e-6)
    del src, dst
    torch.cuda.empty_cache()  # the 2 GiB go back to the driver before the benchmark allocates
    return bandwidth


def kernels(fn):
    """CUDA kernels one call of `fn` launches (torch.profiler), or "?" without the profiler."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    except Exception:  # the profiler is optional; the timing is not
        return "?"


def graphed(fn):
    """fn (no arguments, static buffers) captured once in a CUDA graph: returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def rel(a, b):
    """||a - b|| / ||b||, in float64."""
    a, b = a.double().flatten(), b.double().flatten()
    return ((a - b).norm() / b.norm()).item()


def rope(pos, head_dim, theta, dtype, device):
    """cos and sin of pos * theta^(-2i/head_dim), laid out as Hugging Face's LlamaRotaryEmbedding
    lays them out (the head_dim/2 angles twice; computed in float64, as the benches compute
    their tables), in dtype."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim))
    freqs = pos * inv_freq
    emb = torch.cat((freqs, freqs))
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(t):
    """Hugging Face's rotate_half over the last dimension: (-second half, first half)."""
    half = t.shape[-1] // 2
    return torch.cat((-t[..., half:], t[..., :half]), dim=-1)
