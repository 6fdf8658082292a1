#!/usr/bin/env python3
"""PyTorch side of the MoE benchmark: the layers `moe-bench` runs (Mixtral-8x7B-shaped: hidden
4096, 8 experts, top 2 renormalised, FFN 14336; DeepSeek-V2-Lite-shaped: hidden 2048, 64
experts, top 8 of the full softmax, FFN 1408), bf16, at 64, 8 and 1 tokens, as
- eager: Hugging Face's MixtralSparseMoeBlock loop (a host sync to find the experts hit, then
  per expert a gather, three matmuls and an index_add);
- dense, under a CUDA graph and under torch.compile (mode="reduce-overhead"): every expert on
  every token, weighted by a gate that is 0 where the expert was not chosen — the static-shape
  form that a graph can capture; it reads all experts' weights;
- gathered, under a CUDA graph and torch.compile (up to 8 tokens): the chosen experts' weights
  gathered per (token, slot), then batched matmuls — static shapes reading only chosen experts,
  at the price of copying them.
Timed as `moe-bench` times clusterfuse (CUDA events around a pass of 20 back-to-back steps, 5
warm-up passes, median of 50); roofline = router + selected experts' weights + x + y over the
copy bandwidth measured here (a 1 GiB device-to-device copy, bytes read + written).

    python3 scripts/moe-torch.py              # the timing table
    python3 scripts/moe-torch.py --check DIR  # compare with `moe-bench --dump DIR`

`--check` loads each layer's weights, its 64 tokens and each schedule's routing and output
(`out.<schedule>.bf16`, `ids.<schedule>.u32`): it compares the kernels' experts with
torch.topk on the same logits (float32; a difference is allowed only between exactly equal
logits), and the kernels' and PyTorch eager's outputs with a float64 run of the layer; it
exits 1 if a schedule's routing differs, its output is further than 1e-2 from float64, or a
layer has no schedule's output.
"""
import json
import sys
from pathlib import Path

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torchbench import copy_bandwidth, graphed, kernels, rel, time_us
except ImportError as err:
    print(f"SKIPPED (moe-torch needs PyTorch: {err})")
    sys.exit(0)

LAYERS = {
    "Mixtral-8x7B": dict(hidden=4096, experts=8, top_k=2, ffn=14336, renormalize=True),
    "DeepSeek-V2-Lite": dict(hidden=2048, experts=64, top_k=8, ffn=1408, renormalize=False),
}
TOKENS = [64, 8, 1]
STEPS, WARMUP, REPS = 20, 5, 50
TOLERANCE = 1e-2


def route(x, router, top_k, renormalize):
    """Hugging Face's routing: softmax over all experts (float32), top k, renormalised or not."""
    probs = F.softmax((x @ router.T).to(torch.promote_types(x.dtype, torch.float32)), dim=-1)
    gates, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    return gates.to(x.dtype), ids


def expert(x, w_gate, w_up, w_down):
    return (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ w_down.T


def moe_loop(x, w, top_k, renormalize):
    """MixtralSparseMoeBlock.forward (transformers 4.4x), without the jitter noise."""
    gates, ids = route(x, w["router"], top_k, renormalize)
    out = torch.zeros_like(x)
    mask = F.one_hot(ids, num_classes=w["router"].shape[0]).permute(2, 1, 0)
    for e in torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero():
        slot, token = torch.where(mask[e].squeeze(0))
        y = expert(x[token], w["w_gate"][e].squeeze(0), w["w_up"][e].squeeze(0), w["w_down"][e].squeeze(0))
        out.index_add_(0, token, (y * gates[token, slot, None]).to(x.dtype))
    return out


def moe_dense(x, w, top_k, renormalize):
    """Every expert on every token, gated by 0 where it was not chosen: static shapes."""
    gates, ids = route(x, w["router"], top_k, renormalize)
    dense = torch.zeros(x.shape[0], w["router"].shape[0], dtype=x.dtype, device=x.device).scatter(1, ids, gates)
    h = F.silu(torch.einsum("th,efh->etf", x, w["w_gate"])) * torch.einsum("th,efh->etf", x, w["w_up"])
    y = torch.einsum("etf,ehf->eth", h, w["w_down"])
    return torch.einsum("eth,te->th", y, dense)


def moe_gathered(x, w, top_k, renormalize):
    """The chosen experts' weights gathered per (token, slot), then batched matmuls."""
    gates, ids = route(x, w["router"], top_k, renormalize)
    flat = ids.flatten()
    xs = x.repeat_interleave(top_k, dim=0)[:, None, :]
    h = F.silu(xs @ w["w_gate"][flat].transpose(1, 2)) * (xs @ w["w_up"][flat].transpose(1, 2))
    y = (h @ w["w_down"][flat].transpose(1, 2)).view(x.shape[0], top_k, -1)
    return (y * gates[..., None]).sum(dim=1)


def random_layer(cfg, tokens, gen):
    h, f, e = cfg["hidden"], cfg["ffn"], cfg["experts"]

    def uniform(*shape, scale):
        return ((torch.rand(*shape, generator=gen, device="cuda") * 2 - 1) * scale).to(torch.bfloat16)

    sh, sf = (3.0 / h) ** 0.5, (3.0 / f) ** 0.5
    w = dict(router=uniform(e, h, scale=2 * sh), w_gate=uniform(e, f, h, scale=sh), w_up=uniform(e, f, h, scale=sh), w_down=uniform(e, h, f, scale=sf))
    return uniform(tokens, h, scale=1.0), w


def bench():
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    bandwidth = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()} — PyTorch {torch.__version__}, bf16; median of {REPS} passes of {STEPS} steps "
          f"(CUDA events), µs per step; roofline = router + selected experts' weights + x + y over {bandwidth / 1e12:.2f} TB/s "
          "(measured copy bandwidth)")
    print("| layer | tokens | experts used | variant | kernels | µs | roofline µs | % of roofline |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cfg in LAYERS.items():
        x_all, w = random_layer(cfg, TOKENS[0], gen)
        k, renorm, e = cfg["top_k"], cfg["renormalize"], cfg["experts"]
        expert_bytes = 3 * cfg["hidden"] * cfg["ffn"] * 2
        for tokens in TOKENS:
            x = x_all[:tokens].contiguous()
            selected = int(torch.unique(route(x, w["router"], k, renorm)[1]).numel())
            roofline = ((e * cfg["hidden"] + 2 * tokens * cfg["hidden"]) * 2 + selected * expert_bytes) / bandwidth * 1e6
            reference = moe_loop(x, w, k, renorm)
            variants = [("eager (HF loop)", lambda: moe_loop(x, w, k, renorm), False)]
            variants.append(("dense, CUDA graph", lambda: moe_dense(x, w, k, renorm), True))
            compiled_dense = torch.compile(lambda: moe_dense(x, w, k, renorm), mode="reduce-overhead")
            variants.append(("dense, torch.compile", compiled_dense, False))
            if tokens <= 8:
                variants.append(("gathered, CUDA graph", lambda: moe_gathered(x, w, k, renorm), True))
                compiled_gathered = torch.compile(lambda: moe_gathered(x, w, k, renorm), mode="reduce-overhead")
                variants.append(("gathered, torch.compile", compiled_gathered, False))
            for label, fn, graph in variants:
                err = rel(fn(), reference)
                call = graphed(fn) if graph else fn
                n = kernels(call)
                us = time_us([call] * STEPS, WARMUP, REPS)
                print(f"| {name} | {tokens} | {selected} of {e} | PyTorch {label} | {n} | {us:.1f} | {roofline:.1f} | {roofline / us * 100:.0f}% |"
                      + ("" if err < 2e-2 else f" (differs from eager by {err:.1e})"), flush=True)
        del w, x_all
        torch.cuda.empty_cache()


def load(path, dtype, shape):
    raw = np.fromfile(path, dtype=np.uint16 if dtype == torch.bfloat16 else np.uint32 if dtype == torch.int32 else np.float32)
    t = torch.from_numpy(raw.view(np.int16) if dtype == torch.bfloat16 else raw.view(np.int32) if dtype == torch.int32 else raw)
    return (t.view(torch.bfloat16) if dtype == torch.bfloat16 else t).reshape(shape).cuda()


def check(root):
    failed = False
    for name in LAYERS:
        d = Path(root) / name
        meta = json.loads((d / "meta.json").read_text())
        t, h, e, k, f = meta["tokens"], meta["hidden"], meta["experts"], meta["top_k"], meta["ffn"]
        renorm = meta["renormalize"]
        x = load(d / "x.bf16", torch.bfloat16, (t, h))
        w = dict(router=load(d / "router.bf16", torch.bfloat16, (e, h)), w_gate=load(d / "w_gate.bf16", torch.bfloat16, (e, f, h)),
                 w_up=load(d / "w_up.bf16", torch.bfloat16, (e, f, h)), w_down=load(d / "w_down.bf16", torch.bfloat16, (e, h, f)))
        # torch.topk on the same logits, in float32 (the kernels' precision).
        logits = x.float() @ w["router"].float().T
        top = torch.topk(logits, k, dim=-1)
        # float64: the same routing (in float64), then the chosen experts' FFNs.
        x64 = x.double()
        gates, ids = route(x64, w["router"].double(), k, renorm)
        out64 = torch.zeros_like(x64)
        for ex in torch.unique(ids):
            token, slot = torch.where(ids == ex)
            y = expert(x64[token], w["w_gate"][ex].double(), w["w_up"][ex].double(), w["w_down"][ex].double())
            out64.index_add_(0, token, y * gates[token, slot, None])
        eager = moe_loop(x, w, k, renorm)
        eager_err = rel(eager, out64)
        outputs = sorted(d.glob("out.*.bf16"))
        if not outputs:
            failed = True
            print(f"{name}: no schedule's output in {d} -> FAIL")
        for path in outputs:
            schedule = path.name.split(".")[1]
            ours = load(path, torch.bfloat16, (t, h))
            our_ids = load(d / f"ids.{schedule}.u32", torch.int32, (t, k)).long()
            differ = our_ids != top.indices
            ties = torch.gather(logits, 1, our_ids) == top.values
            routing_ok = bool((~differ | ties).all())
            ours_err = rel(ours, out64)
            ok = routing_ok and ours_err <= TOLERANCE
            failed |= not ok
            print(f"{name}, {t} tokens, {schedule} schedule: routing vs torch.topk (float32 logits): {int(differ.sum())} of {differ.numel()} "
                  f"choices differ ({int((differ & ~ties).sum())} not exact ties); rel error vs float64: clusterfuse {ours_err:.2e}, "
                  f"PyTorch eager bf16 {eager_err:.2e}, clusterfuse vs eager {rel(ours, eager):.2e} -> {'ok' if ok else 'FAIL'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("SKIPPED (moe-torch needs a CUDA GPU)")
        sys.exit(0)
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        check(sys.argv[2])
    else:
        bench()
