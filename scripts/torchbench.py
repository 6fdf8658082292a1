"""What the PyTorch benchmark scripts share: kernel counting and CUDA-graph capture."""

import torch


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
