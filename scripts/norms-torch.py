#!/usr/bin/env python3
"""PyTorch side of the fused-norms benchmark: LayerNorm(x + b) -> GELU and RMSNorm(x + residual)
(which also returns the new residual), fp16, eager and torch.compile, timed exactly as
`norms-bench` times clusterfuse: CUDA events around a pass of at least 20 calls rotating over
`copies` input sets (at least 2 x 60 MB L2 per rotation, at most 256 copies), 5 warm-up
passes, median of 50, time per call. Prints the same markdown columns; `kernels` is counted
with torch.profiler.

    python3 scripts/norms-torch.py
"""
import sys

try:
    import torch
    import torch.nn.functional as F
    from torchbench import copy_bandwidth, kernels, time_us
except ImportError as err:
    print(f"SKIPPED (norms-torch needs PyTorch: {err})")
    sys.exit(0)

HIDDEN = [768, 1024, 4096, 8192]
ROWS = [1, 64, 512, 4096]
L2 = 60 << 20
MAX_COPIES = 256
MIN_CALLS = 20
WARMUP, REPS = 5, 50
EPS = 1e-5


def layernorm_gelu(x, b, gamma, beta):
    return F.gelu(F.layer_norm(x + b, (x.shape[-1],), gamma, beta, EPS))


def add_rmsnorm(x, r, w):
    h = x + r
    var = h.float().pow(2).mean(-1, keepdim=True)
    return (h.float() * torch.rsqrt(var + EPS)).to(h.dtype) * w, h




def row(bandwidth, op, hidden, rows, variant, fn, sets, nbytes):
    calls = [lambda args=args: fn(*args) for args in sets]
    us = time_us(calls * -(-MIN_CALLS // len(calls)), WARMUP, REPS)
    roofline = nbytes / bandwidth * 1e6
    print(f"| {op} | {hidden} | {rows} | {variant} | {kernels(lambda: fn(*sets[0]))} | {len(sets)} | {us:.2f} | {nbytes / us * 1e-3:.0f} | {roofline / us * 100:.1f}% |", flush=True)


def main():
    if not torch.cuda.is_available():
        print("SKIPPED (norms-torch needs a CUDA GPU)")
        return
    dev = torch.device("cuda")
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} — PyTorch {torch.__version__}, fp16, median of {REPS} passes (CUDA events), µs per call; roofline {bandwidth / 1e12:.2f} TB/s (measured copy bandwidth)")
    print("| op | hidden | rows | variant | kernels | copies | µs | GB/s | % roofline |")
    print("|---|---|---|---|---|---|---|---|---|")
    torch._dynamo.config.cache_size_limit = 64  # one graph per hidden size, static and dynamic rows
    compiled_ln = torch.compile(layernorm_gelu)
    compiled_rms = torch.compile(add_rmsnorm)
    for hidden in HIDDEN:
        for rows in ROWS:
            n = rows * hidden
            rand = lambda *shape: torch.randn(*shape, device=dev, dtype=torch.float16)
            col = [rand(hidden) for _ in range(3)]

            nbytes = 2 * n * 2 + 3 * hidden * 2
            copies = max(1, min(MAX_COPIES, -(-2 * L2 // nbytes)))
            sets = [(rand(rows, hidden), *[c.clone() for c in col]) for _ in range(copies)]
            if rows > 1:  # dynamo specialises sizes 0 and 1
                for s in sets:
                    torch._dynamo.mark_dynamic(s[0], 0)
            row(bandwidth, "LayerNorm(x+b)→GELU", hidden, rows, "torch eager", layernorm_gelu, sets, nbytes)
            row(bandwidth, "LayerNorm(x+b)→GELU", hidden, rows, "torch.compile", compiled_ln, sets, nbytes)
            del sets

            nbytes = 4 * n * 2 + hidden * 2
            copies = max(1, min(MAX_COPIES, -(-2 * L2 // nbytes)))
            sets = [(rand(rows, hidden), rand(rows, hidden), col[0].clone()) for _ in range(copies)]
            if rows > 1:
                for s in sets:
                    torch._dynamo.mark_dynamic(s[0], 0)
                    torch._dynamo.mark_dynamic(s[1], 0)
            row(bandwidth, "RMSNorm(x+r)", hidden, rows, "torch eager", add_rmsnorm, sets, nbytes)
            row(bandwidth, "RMSNorm(x+r)", hidden, rows, "torch.compile", compiled_rms, sets, nbytes)
            del sets


if __name__ == "__main__":
    main()
