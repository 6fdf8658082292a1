#!/usr/bin/env python3
"""PyTorch side of the decode-attention benchmark: the decode step of a Llama-2-7B attention
block (RMSNorm -> QKV projection -> RoPE (rotate-half) -> append K/V to the cache -> attention
over the cache -> output projection + residual), fp16, batch 1, KV lengths 1024, 4096, 16384,
as PyTorch eager, torch.compile, and eager replayed from a CUDA graph. Timed as `decode-bench`
times clusterfuse: CUDA events around a pass of 20 back-to-back steps, 5 warm-up passes, median
of 50, time per step; the same markdown columns (`kernels` counted with torch.profiler).

    python3 scripts/decode-torch.py              # the timing table
    python3 scripts/decode-torch.py --check DIR  # compare with `decode-bench --dump DIR`

`--check` loads the inputs `decode-bench` drew (L = 1024, f16, batch 1) and the fused kernels' outputs, runs
the same step in PyTorch (fp16 eager, and float64 on upcast inputs), and prints the relative
errors ||a - b|| / ||b||; it exits 1 if the kernel is further than 2e-3 from the float64 step.
"""
import json
import sys
from pathlib import Path

try:
    import torch
    import torch.nn.functional as F
    from torchbench import copy_bandwidth, graphed, kernels, rel, rope, rotate_half, time_us
except ImportError as err:
    print(f"SKIPPED (decode-torch needs PyTorch: {err})")
    sys.exit(0)

HIDDEN, HEADS, HEAD_DIM = 4096, 32, 128
LENGTHS = [1024, 4096, 16384]
EPS, THETA = 1e-5, 10000.0
STEPS, WARMUP, REPS = 20, 5, 50
TOLERANCE = 2e-3


def block(x, norm_w, w_qkv, w_o, k_cache, v_cache, cos, sin, pos: int):
    """One decode step. x: [B, hidden]; caches: [B, heads, max_len, 128], tokens 0..pos-1 valid;
    the new k, v are written at pos (rounded to fp16, as an fp16 cache stores them)."""
    batch, heads = x.shape[0], k_cache.shape[1]
    h = x.to(torch.promote_types(x.dtype, torch.float32))
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    xn = norm_w * h.to(x.dtype)
    q, k, v = (xn @ w_qkv.t()).view(batch, 3, heads, HEAD_DIM).unbind(1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    k_cache[:, :, pos] = k.half().to(k.dtype)
    v_cache[:, :, pos] = v.half().to(v.dtype)
    attn = F.scaled_dot_product_attention(q[:, :, None], k_cache[:, :, : pos + 1], v_cache[:, :, : pos + 1])
    return x + attn.reshape(batch, -1) @ w_o.t()


def bench():
    dev = torch.device("cuda")
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} — PyTorch {torch.__version__}, Llama-2-7B decode attention block (hidden {HIDDEN}, {HEADS} heads × {HEAD_DIM}, fp16, batch 1); median of {REPS} passes of {STEPS} steps (CUDA events), µs per step; roofline = bytes / {bandwidth / 1e12:.2f} TB/s (measured copy bandwidth)", flush=True)
    torch._dynamo.config.cache_size_limit = 64  # one graph per position
    compiled = torch.compile(block)
    max_len = max(LENGTHS)
    a = HIDDEN ** -0.5
    uniform = lambda *shape, lo=-1.0, hi=1.0: (torch.rand(*shape, device=dev) * (hi - lo) + lo).half()
    x, norm_w = uniform(1, HIDDEN, lo=-0.5, hi=0.5), uniform(HIDDEN, lo=0.5, hi=1.5)
    w_qkv, w_o = uniform(3 * HIDDEN, HIDDEN) * (2.4 * a), uniform(HIDDEN, HIDDEN) * (8 * a)
    k_cache, v_cache = uniform(1, HEADS, max_len, HEAD_DIM) * 2.4, uniform(1, HEADS, max_len, HEAD_DIM)
    rows = []
    for length in LENGTHS:
        pos = length - 1
        cos, sin = rope(pos, HEAD_DIM, THETA, torch.float16, dev)
        args = (x, norm_w, w_qkv, w_o, k_cache, v_cache, cos, sin, pos)
        nbytes = (4 * HIDDEN * HIDDEN + HIDDEN) * 2 + 2 * HEADS * length * HEAD_DIM * 2 + 2 * HIDDEN * 2
        roofline = nbytes / bandwidth * 1e6
        eager_out = block(*args)
        variants = [("torch eager", lambda: block(*args)), ("torch.compile", lambda: compiled(*args))]
        variants.append(("torch eager + CUDA graph", graphed(lambda: block(*args))))
        for name, fn in variants:
            if name == "torch.compile":
                err = f"{rel(compiled(*args), eager_out):.1e} vs eager"
            else:
                err = "–"
            us = time_us([fn] * STEPS, WARMUP, REPS)
            row = f"| {length} | {name} | {kernels(fn)} | {us:.1f} | {roofline:.1f} | {roofline / us * 100:.0f}% | {err} |"
            print(row, flush=True)
            rows.append(row)
    print("| L | variant | kernels | µs | roofline µs | % of roofline | rel error |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def load(directory, name, shape, dev):
    raw = bytearray((directory / f"{name}.f16").read_bytes())
    return torch.frombuffer(raw, dtype=torch.float16).view(shape).to(dev)


def check(directory):
    directory = Path(directory)
    dev = torch.device("cuda")
    meta = json.loads((directory / "meta.json").read_text())
    hidden, heads, pos = meta["hidden"], meta["heads"], meta["pos"]
    assert meta["head_dim"] == HEAD_DIM and meta["eps"] == EPS and meta["theta"] == THETA, meta
    assert meta.get("dtype", "f16") == "f16" and meta.get("batch", 1) == 1, f"--check compares f16 batch-1 dumps: {meta}"
    x = load(directory, "x", (1, hidden), dev)
    norm_w = load(directory, "norm_w", (hidden,), dev)
    w_qkv = load(directory, "w_qkv", (3 * hidden, hidden), dev)
    w_o = load(directory, "w_o", (hidden, hidden), dev)
    kernel = {name: load(directory, name, (heads, HEAD_DIM) if name != "out" else (1, hidden), dev) for name in ("out", "k_new", "v_new")}
    results = {}
    for dtype in (torch.float16, torch.float64):
        caches = []
        for name in ("k_cache", "v_cache"):
            cache = torch.full((1, heads, pos + 1, HEAD_DIM), float("nan"), dtype=dtype, device=dev)
            cache[0, :, :pos] = load(directory, name, (heads, pos, HEAD_DIM), dev).to(dtype)
            caches.append(cache)
        cos, sin = rope(pos, HEAD_DIM, THETA, dtype, dev)
        out = block(x.to(dtype), norm_w.to(dtype), w_qkv.to(dtype), w_o.to(dtype), *caches, cos, sin, pos)
        results[dtype] = {"out": out, "k_new": caches[0][0, :, pos], "v_new": caches[1][0, :, pos]}
    print(f"decode step, hidden {hidden}, {heads} heads, pos {pos}: relative error ||a - b|| / ||b||")
    print("| output | kernel vs torch fp16 | kernel vs torch float64 | torch fp16 vs torch float64 |")
    print("|---|---|---|---|")
    worst = 0.0
    for name in ("out", "k_new", "v_new"):
        fp16, fp64 = results[torch.float16][name], results[torch.float64][name]
        err = rel(kernel[name], fp64)
        worst = max(worst, err)
        print(f"| {name} | {rel(kernel[name], fp16):.2e} | {err:.2e} | {rel(fp16, fp64):.2e} |")
    if not worst <= TOLERANCE:
        print(f"FAIL: the kernel is {worst:.2e} from the float64 step (tolerance {TOLERANCE})")
        sys.exit(1)


def main():
    if not torch.cuda.is_available():
        print("SKIPPED (decode-torch needs a CUDA GPU)")
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        bench()


if __name__ == "__main__":
    main()
