#!/usr/bin/env python3
"""PyTorch side of llama-bench: one decode step of a Llama-3.2-1B-shaped model (16 layers,
hidden 2048, 32 query / 8 KV heads of 64, MLP 8192, vocab 128256, tied embedding / LM head,
RMSNorm eps 1e-5, rotate-half RoPE with theta 500000, SiLU-gated MLP), random bf16 weights,
batch 1, a static bf16 KV cache written in place at the step's position, KV lengths 1024 and
4096: PyTorch eager, torch.compile (default, and mode="reduce-overhead", which adds CUDA
graphs), and eager replayed from a CUDA graph. q/k/v and gate/up are fused into one weight each
(fewer, larger GEMVs than Hugging Face's separate projections; the same bytes). Attention is
F.scaled_dot_product_attention with enable_gqa. Timed as llama-bench times clusterfuse: CUDA
events around a pass of 20 back-to-back steps (same position), 3 warm-up passes, median of 30,
µs per step and tokens/s; roofline = bytes that must move / the copy bandwidth measured first.

    python3 scripts/llama-torch.py

The weights are PyTorch's own random draws (timing does not depend on them); each variant's
logits are compared with eager's (relative error ||a - b|| / ||b||).
"""
import sys

try:
    import torch
    import torch.nn.functional as F
    from torchbench import copy_bandwidth, graphed, kernels, rel, rope, rotate_half, time_us
except ImportError as err:
    print(f"SKIPPED (llama-torch needs PyTorch: {err})")
    sys.exit(0)

LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 16, 2048, 32, 8, 64, 8192, 128256
LENGTHS = [1024, 4096]
EPS, THETA = 1e-5, 500000.0
STEPS, WARMUP, REPS = 20, 3, 30
TOKEN = 128000


def rms_norm(x, w):
    """Hugging Face's LlamaRMSNorm: in float32, then back to bf16, times the weight."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS)
    return w * h.to(x.dtype)


def step(model, k_caches, v_caches, cos, sin, pos: int):
    """One decode step of the token TOKEN at position pos; returns the logits [1, vocab]."""
    emb, final_norm, layers = model
    x = emb[TOKEN:TOKEN + 1]
    for (norm1, w_qkv, w_o, norm2, w_gate_up, w_down), k_cache, v_cache in zip(layers, k_caches, v_caches):
        qkv = rms_norm(x, norm1) @ w_qkv.t()
        q, k, v = qkv.split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
        q, k, v = q.view(1, HEADS, 1, HEAD_DIM), k.view(1, KV_HEADS, 1, HEAD_DIM), v.view(1, KV_HEADS, 1, HEAD_DIM)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_cache[:, :, pos] = k[:, :, 0]
        v_cache[:, :, pos] = v[:, :, 0]
        attn = F.scaled_dot_product_attention(q, k_cache[:, :, : pos + 1], v_cache[:, :, : pos + 1], enable_gqa=True)
        x = x + attn.reshape(1, HIDDEN) @ w_o.t()
        gate, up = (rms_norm(x, norm2) @ w_gate_up.t()).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ w_down.t()
    return rms_norm(x, final_norm) @ emb.t()


def main():
    if not torch.cuda.is_available():
        print("SKIPPED (llama-torch needs a CUDA GPU)")
        return
    dev = torch.device("cuda")
    torch.manual_seed(0)
    max_len = max(LENGTHS)

    def uniform(*shape, bound):
        return ((torch.rand(*shape, device=dev) * 2 - 1) * bound).to(torch.bfloat16)

    def norm_weight():
        return (torch.rand(HIDDEN, device=dev) + 0.5).to(torch.bfloat16)

    a_h, a_i = (3 / HIDDEN) ** 0.5, (3 / INTER) ** 0.5
    layers = [
        (norm_weight(), uniform((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, bound=a_h), uniform(HIDDEN, HIDDEN, bound=a_h),
         norm_weight(), uniform(2 * INTER, HIDDEN, bound=a_h), uniform(HIDDEN, INTER, bound=a_i))
        for _ in range(LAYERS)
    ]
    model = (uniform(VOCAB, HIDDEN, bound=0.05), norm_weight(), layers)
    params = sum(t.numel() for t in [model[0], model[1]] + [w for layer in layers for w in layer])
    k_caches = [uniform(1, KV_HEADS, max_len, HEAD_DIM, bound=1.7) for _ in range(LAYERS)]
    v_caches = [uniform(1, KV_HEADS, max_len, HEAD_DIM, bound=1.7) for _ in range(LAYERS)]
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} — PyTorch {torch.__version__}, Llama-3.2-1B decode step ({params} parameters, bf16, batch 1, static KV cache); "
          f"median of {REPS} passes of {STEPS} steps (CUDA events), µs per step; roofline = bytes / {bandwidth / 1e12:.2f} TB/s (measured copy bandwidth)", flush=True)
    torch._dynamo.config.cache_size_limit = 64  # one graph per position
    compiled = torch.compile(step)
    overhead = torch.compile(step, mode="reduce-overhead")
    rows = []
    for length in LENGTHS:
        pos = length - 1
        cos, sin = rope(pos, HEAD_DIM, THETA, torch.bfloat16, dev)
        args = (model, k_caches, v_caches, cos, sin, pos)
        nbytes = params * 2 + LAYERS * 2 * KV_HEADS * length * HEAD_DIM * 2 + HIDDEN * 2 + VOCAB * 4
        roofline = nbytes / bandwidth * 1e6
        eager_logits = step(*args).clone()
        variants = [
            ("torch eager", lambda: step(*args)),
            ("torch.compile", lambda: compiled(*args)),
            ("torch.compile reduce-overhead", lambda: overhead(*args)),
        ]
        try:
            variants.append(("torch eager + CUDA graph", graphed(lambda: step(*args))))
        except Exception as err:  # report and go on: the other variants still count
            print(f"torch eager + CUDA graph: capture failed: {err}", flush=True)
        for name, fn in variants:
            try:
                # A graph's replay returns nothing: its logits are not compared.
                err = f"{rel(fn(), eager_logits):.1e} vs eager" if name.startswith("torch.compile") else "–"
                us = time_us([fn] * STEPS, WARMUP, REPS)
                count = kernels(fn)
            except Exception as exc:  # report and go on: the other variants still count
                print(f"{name} at L {length}: failed: {exc}", flush=True)
                continue
            row = f"| {length} | {name} | {count} | {us:.1f} | {1e6 / us:.0f} | {roofline:.1f} | {roofline / us * 100:.0f}% | {err} |"
            print(row, flush=True)
            rows.append(row)
    print("| L | variant | kernels | µs/step | tokens/s | roofline µs | % of roofline | logits rel error |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
