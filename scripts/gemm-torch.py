#!/usr/bin/env python3
"""PyTorch side of the GEMM benchmark: cuBLAS through torch.matmul, bf16 in / bf16 out, on the
shapes of `gemm-bench`, timed as it times clusterfuse: CUDA events around a pass of `calls`
back-to-back calls (about 1 ms of work at 300 TFLOP/s, 20-200 calls), 3 warm-up passes, median of
20, time per call; TFLOP/s counts 2*M*N*K. Epilogues: none (`a @ b`) and bias + GELU
(`F.gelu(a @ b + bias, approximate="tanh")`, eager: cuBLAS then separate kernels). Prints the
same markdown columns (the error column is against an f64 reference on 256 sampled entries).

    python3 scripts/gemm-torch.py
"""
import math
import sys

try:
    import torch
    import torch.nn.functional as F
    from torchbench import time_us
except ImportError as err:
    print(f"SKIPPED (gemm-torch needs PyTorch: {err})")
    sys.exit(0)

WARMUP, REPS, SAMPLES = 3, 20, 256


def shapes():
    out = [("square", 4096, 4096, 4096), ("square", 8192, 8192, 8192)]
    for batch in (1, 8, 32):
        for n, k in ((768, 768), (3072, 768), (768, 3072)):
            out.append(("BERT-base", 128 * batch, n, k))
    for m in (1, 8, 64, 512):
        for n, k in ((4096, 4096), (11008, 4096), (4096, 11008)):
            out.append(("Llama-2-7B", m, n, k))
    return out



def sampled_error(a, b, bias, out, epilogue):
    m, n = out.shape
    i = torch.randint(0, m, (SAMPLES,), device=a.device)
    j = torch.randint(0, n, (SAMPLES,), device=a.device)
    ref = (a[i].double() * b[:, j].double().t()).sum(1)
    if epilogue == "bias+gelu":
        x = ref + bias[j].double()
        ref = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    scale = ref.pow(2).mean().sqrt().clamp_min(1e-300)
    return ((out[i, j].double() - ref).abs() / scale).max().item()


def main():
    if not torch.cuda.is_available():
        print("SKIPPED (gemm-torch needs a CUDA GPU)")
        return
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} — PyTorch {torch.__version__} (cuBLAS), bf16 in / bf16 out; median of {REPS} passes (CUDA events), µs per call")
    print(f"| workload | M | N | K | epilogue | calls | µs | TFLOP/s | max rel error ({SAMPLES} samples) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for workload, m, n, k in shapes():
        a = torch.empty(m, k, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        b = torch.empty(k, n, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        bias = torch.empty(n, device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        flops = 2 * m * n * k
        calls = max(20, min(200, math.ceil(3e8 / flops)))
        variants = {
            "none": lambda: torch.matmul(a, b),
            "bias+gelu": lambda: F.gelu(torch.matmul(a, b) + bias, approximate="tanh"),
        }
        for epilogue, fn in variants.items():
            error = sampled_error(a, b, bias, fn(), epilogue)
            us = time_us([fn] * calls, WARMUP, REPS)
            print(f"| {workload} | {m} | {n} | {k} | {epilogue} | {calls} | {us:.1f} | {flops / us * 1e-6:.1f} | {error:.1e} |", flush=True)
        del a, b, bias


if __name__ == "__main__":
    main()
