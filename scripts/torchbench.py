"""What the PyTorch benchmark scripts share: CUDA-event timing, kernel counting and CUDA-graph
capture."""

import torch


def time_us(calls, warmup, reps):
    """Median µs per call of `calls` (zero-argument callables run back to back in each pass),
    over `reps` passes timed with CUDA events after `warmup` untimed ones."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for rep in range(warmup + reps):
        start.record()
        for call in calls:
            call()
        end.record()
        end.synchronize()
        if rep >= warmup:
            samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    samples.sort()
    return samples[len(samples) // 2]


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
