#!/usr/bin/env python3
"""PyTorch side of issue 7's case study: the encoder of `bert-bench` (BERT-base, post-LN, 12
layers, hidden 768, 12 heads, ffn 3072, seq 128, fp16, random weights, no mask) written as a
framework model runs it (one QKV linear, matmul / sqrt(64), softmax, matmul, permute +
contiguous, linear + residual, layer_norm, linear, exact GELU, linear + residual, layer_norm),
eager and replayed from a CUDA graph (torch.cuda.CUDAGraph), batch 1-64. Latency: median of 20
forward passes after 3 warm-up (CUDA events); kernels: CUDA kernels of one eager pass
(torch.profiler). Prints the markdown table of `bert-bench`.

    python3 scripts/bert-torch.py
"""
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




def main():
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
        for batch in BATCHES:
            x = (torch.rand(batch, SEQ, HIDDEN, device=dev) * 2 - 1).half()
            eager = lambda: encoder(x, layers)
            count = kernels(eager)
            print(f"| {batch} | {batch * SEQ} | torch eager | {count} | {time_us([eager], WARMUP, REPS):.1f} |", flush=True)
            replay = graphed(eager)
            print(f"| {batch} | {batch * SEQ} | torch graph | {count} | {time_us([replay], WARMUP, REPS):.1f} |", flush=True)
            del replay


if __name__ == "__main__":
    main()
