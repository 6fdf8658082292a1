#!/usr/bin/env python3
"""PyTorch side of issue 7's case study: the encoder of `bert-bench` (BERT-base, post-LN, 12
layers, hidden 768, 12 heads, ffn 3072, seq 128, fp16, random weights, no mask) written as a
framework model runs it (one QKV linear, matmul / sqrt(64), softmax, matmul, permute +
contiguous, linear + residual, layer_norm, linear, exact GELU, linear + residual, layer_norm),
eager and replayed from a CUDA graph (torch.cuda.CUDAGraph), batch 1-64. Latency: median of 20
forward passes after 3 warm-up (CUDA events around each, from an idle GPU: the launch counts);
kernels: CUDA kernels of one eager pass (torch.profiler). Prints the markdown table of `bert-bench`.

With `--trace DIR`, one eager pass per batch size is also written to DIR as a clusterfuse
launch trace (`torch-bNN.jsonl`: each kernel with its launch call's CPU times and its GPU
times, from the profiler's correlated runtime and kernel events), for the same TKLQT and
proximity analysis as clusterfuse's own: `clusterfuse-trace sweep DIR/torch-b*.jsonl`.
With `--batches 1,2`, only those batch sizes (as `bert-bench DIR 1 2` takes them).

    python3 scripts/bert-torch.py [--trace DIR] [--batches B,...]
"""
import json
import os
import math
import sys

try:
    import torch
    import torch.nn.functional as F
    from torchbench import graphed, kernels, time_us
except ImportError as err:
    print(f"SKIPPED (bert-torch needs PyTorch: {err})")
    sys.exit(0)

LAYERS, HIDDEN, HEADS, FFN, SEQ = 12, 768, 12, 3072, 128
HEAD_DIM = HIDDEN // HEADS
BATCHES = (1, 2, 4, 8, 16, 32, 64)
WARMUP, REPS = 3, 20


def random_layer(dev):
    """Weights as example 11 draws them: projections with variance 1/in, biases and beta in
    ±0.1, gamma in 1 ± 0.1 (nn.Linear's layout: out × in)."""
    def uniform(*shape, centre=0.0, half=0.1):
        return ((torch.rand(*shape, device=dev) * 2 - 1) * half + centre).half()

    w = lambda fan_in: math.sqrt(3 / fan_in)
    return dict(
        wqkv=uniform(3 * HIDDEN, HIDDEN, half=w(HIDDEN)), bqkv=uniform(3 * HIDDEN),
        wo=uniform(HIDDEN, HIDDEN, half=w(HIDDEN)), bo=uniform(HIDDEN),
        g1=uniform(HIDDEN, centre=1.0), b1n=uniform(HIDDEN),
        w1=uniform(FFN, HIDDEN, half=w(HIDDEN)), b1=uniform(FFN),
        w2=uniform(HIDDEN, FFN, half=w(FFN)), b2=uniform(HIDDEN),
        g2=uniform(HIDDEN, centre=1.0), b2n=uniform(HIDDEN),
    )


def layer(x, p):
    b, s, _ = x.shape
    qkv = F.linear(x, p["wqkv"], p["bqkv"]).view(b, s, 3, HEADS, HEAD_DIM).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HEAD_DIM), dim=-1)
    ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(b, s, HIDDEN)
    h = F.layer_norm(F.linear(ctx, p["wo"], p["bo"]) + x, (HIDDEN,), p["g1"], p["b1n"], eps=1e-5)
    up = F.gelu(F.linear(h, p["w1"], p["b1"]))
    return F.layer_norm(F.linear(up, p["w2"], p["b2"]) + h, (HIDDEN,), p["g2"], p["b2n"], eps=1e-5)


def encoder(x, layers):
    for p in layers:
        x = layer(x, p)
    return x


def write_trace(fn, path, batch):
    """Profiles one call of `fn` and writes it as a clusterfuse trace (see the module docs):
    times in ns from the first launch call, a sync event at the end."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    chrome = path + ".chrome.json"
    prof.export_chrome_trace(chrome)
    with open(chrome) as f:
        events = json.load(f)["traceEvents"]
    os.remove(chrome)
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "LaunchKernel" in e.get("name", "") and "correlation" in e.get("args", {})}
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and e["args"].get("correlation") in calls),
                     key=lambda e: calls[e["args"]["correlation"]]["ts"])
    origin = min(calls[k["args"]["correlation"]]["ts"] for k in kernels)
    ns = lambda us: max(0, round((us - origin) * 1e3))
    with open(path, "w") as out:
        out.write(json.dumps({"label": f"PyTorch eager b={batch}", "batch": batch}) + "\n")
        for k in kernels:
            call = calls[k["args"]["correlation"]]
            out.write(json.dumps({
                "event": "launch", "kernel": k["name"][:120],
                "grid": list(k["args"].get("grid", [1, 1, 1])), "block": list(k["args"].get("block", [1, 1, 1])),
                "cpu_call_ns": ns(call["ts"]), "cpu_return_ns": ns(call["ts"] + call["dur"]),
                "gpu_start_ns": ns(k["ts"]), "gpu_end_ns": ns(k["ts"] + k["dur"]),
            }) + "\n")
        end = max(max(k["ts"] + k["dur"] for k in kernels), max(c["ts"] + c["dur"] for c in calls.values()))
        out.write(json.dumps({"event": "sync", "cpu_ns": ns(end)}) + "\n")
    return len(kernels)


def main():
    trace_dir = sys.argv[sys.argv.index("--trace") + 1] if "--trace" in sys.argv else None
    batches = tuple(int(b) for b in sys.argv[sys.argv.index("--batches") + 1].split(",")) if "--batches" in sys.argv else BATCHES
    if trace_dir:
        os.makedirs(trace_dir, exist_ok=True)
    if not torch.cuda.is_available():
        print("SKIPPED (bert-torch needs a CUDA GPU)")
        return
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    print(f"{torch.cuda.get_device_name()} — PyTorch {torch.__version__}, BERT-base encoder: {LAYERS} layers, hidden {HIDDEN}, {HEADS} heads, ffn {FFN}, seq {SEQ}, fp16; µs per forward pass, median of {REPS} (CUDA events)")
    layers = [random_layer(dev) for _ in range(LAYERS)]
    print("| batch | tokens | mode | kernels | µs |")
    print("|---|---|---|---|---|")
    with torch.inference_mode():
        for batch in batches:
            x = (torch.rand(batch, SEQ, HIDDEN, device=dev) * 2 - 1).half()
            eager = lambda: encoder(x, layers)
            count = kernels(eager)
            print(f"| {batch} | {batch * SEQ} | torch eager | {count} | {time_us([eager], WARMUP, REPS, lead_in=False):.1f} |", flush=True)
            replay = graphed(eager)
            print(f"| {batch} | {batch * SEQ} | torch graph | {count} | {time_us([replay], WARMUP, REPS, lead_in=False):.1f} |", flush=True)
            del replay
            if trace_dir:
                path = os.path.join(trace_dir, f"torch-b{batch:02d}.jsonl")
                print(f"wrote {path}: {write_trace(eager, path, batch)} launches", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
