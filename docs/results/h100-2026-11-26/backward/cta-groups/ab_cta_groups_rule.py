"""The package against the one before it (cutile_fmha_old, the committed head) after two
changes: tile_major's groups of at least MIN_GROUP_CTAS CTAs (every causal kernel's CTA
order), and the one-kernel backward ("dkdv_dq") for plain D=128 calls with at most two
query heads to a K/V head. bf16, rotating rounds in one process, ours in CUDA graphs,
cuDNN eager. Parts: bwd (dense backward), fwd (causal forward), varlen (packed backward);
final (a few of each, after tile_major lost a redundant max that had cost D=256's one kernel
16 bytes of stack).
One JSON line per shape."""
import json, statistics, sys
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
import cutile_fmha as new
import cutile_fmha_old as old
from cutile_fmha.steps.backward import attention_backward as new_backward
from cutile_fmha_old.steps.backward import attention_backward as old_backward
from cutile_fmha.steps import varlen as new_varlen
from cutile_fmha_old.steps import varlen as old_varlen

ROUNDS = 3
DT = torch.bfloat16


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(label, fns, flops, check):
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=100))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(json.dumps({"shape": label, "ms": med, "new_over_old": med["new"] / med["old"],
                      "speed_over_cudnn": {n: med["cudnn"] / m for n, m in med.items()} if "cudnn" in med else None,
                      "tflops": {n: flops / m / 1e9 for n, m in med.items()}, "rounds": res,
                      "check": check}), flush=True)


def inputs(B, H, HKV, N, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=DT, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=DT, generator=g) for _ in range(2))
    return q, k, v, do


def cudnn_backward(q, k, v, do, causal, gqa):
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=gqa)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


def bwd(B, H, HKV, N, D, causal):
    q, k, v, do = inputs(B, H, HKV, N, D, N + H + HKV + D)
    out, lse = new.attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    fns = {"new": lambda: new_backward(q, k, v, out, lse, do, causal=causal),
           "old": lambda: old_backward(q, k, v, out, lse, do, causal=causal),
           "cudnn": cudnn_backward(q, k, v, do, causal, HKV != H)}
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    check = {n: [rel(a, b) for a, b in zip(grads[n], grads["old"])] for n in grads}
    run(f"backward B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}", fns,
        2.5 * 4 * B * H * N * N * D / (2 if causal else 1), check)


def fwd(B, H, HKV, N, D):
    q, k, v, _ = inputs(B, H, HKV, N, D, N + H + D)
    gqa = HKV != H

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    fns = {"new": lambda: new.attention(q, k, v, is_causal=True, enable_gqa=gqa),
           "old": lambda: old.attention(q, k, v, is_causal=True, enable_gqa=gqa), "cudnn": cudnn}
    outs = {n: f() for n, f in fns.items()}
    check = {n: rel(outs[n], outs["old"]) for n in outs}
    run(f"forward B={B} H={H}/{HKV} N={N} D={D} causal", fns, 4 * B * H * N * N * D / 2, check)


def varlen(lengths, H, HKV, D, causal):
    g = torch.Generator(device="cuda").manual_seed(len(lengths) + H)
    total = sum(lengths)
    q, do = (torch.randn(total, H, D, device="cuda", dtype=DT, generator=g) for _ in range(2))
    k, v = (torch.randn(total, HKV, D, device="cuda", dtype=DT, generator=g) for _ in range(2))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    views = [t.transpose(0, 1)[None] for t in (q, k, v, do)]
    m = max(lengths)
    fns = {}
    for name, module in (("new", new_varlen), ("old", old_varlen)):
        bounds = module.SequenceBounds.packed(cu, cu)
        out, lse = module.varlen_forward(*views[:3], bounds, m, causal=causal, scale=D ** -0.5, with_lse=True)
        fns[name] = lambda module=module, bounds=bounds, out=out, lse=lse: module.varlen_backward(
            *views[:3], out, lse, views[3], bounds, m, m, causal=causal, scale=D ** -0.5)
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    check = {n: [rel(a, b) for a, b in zip(grads[n], grads["old"])] for n in grads}
    run(f"varlen backward {len(lengths)} x {m} H={H}/{HKV} D={D} {'causal' if causal else 'non-causal'}",
        fns, 2.5 * 4 * H * sum(n * n for n in lengths) * D / (2 if causal else 1), check)


parts = sys.argv[1:] or ["bwd", "fwd", "varlen"]
print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
if "bwd" in parts:
    for shape in ((4, 16, 4, 2048, 128, True), (4, 16, 4, 2048, 128, False), (4, 32, 8, 4096, 128, True),
                  (2, 32, 8, 4096, 128, True), (4, 64, 8, 4096, 128, True), (4, 32, 32, 4096, 128, True),
                  (4, 32, 32, 4096, 128, False), (4, 32, 32, 1024, 128, True), (1, 32, 32, 16384, 128, False),
                  (4, 32, 16, 8192, 128, True), (4, 32, 8, 4096, 64, True), (4, 64, 8, 2048, 64, True),
                  (4, 16, 4, 4096, 256, True), (4, 16, 16, 4096, 256, True)):
        bwd(*shape)
if "fwd" in parts:
    for shape in ((4, 32, 32, 8192, 128), (4, 16, 4, 2048, 128), (1, 32, 8, 16384, 128),
                  (4, 16, 16, 8192, 256), (4, 32, 32, 8192, 64)):
        fwd(*shape)
if "final" in parts:
    for shape in ((4, 16, 4, 2048, 128, True), (4, 32, 8, 4096, 128, True), (4, 32, 32, 4096, 128, True),
                  (4, 32, 32, 4096, 128, False), (4, 64, 8, 2048, 64, True), (4, 16, 4, 4096, 256, True),
                  (4, 16, 16, 4096, 256, True)):
        bwd(*shape)
    fwd(4, 32, 32, 8192, 128)
    fwd(4, 16, 16, 8192, 256)
    varlen([2048] * 16, 32, 32, 128, True)
if "varlen" in parts:
    varlen([2048] * 16, 32, 32, 128, True)
    varlen([512, 1024, 2048, 4096, 8192, 1000, 3000, 700], 32, 32, 128, False)
    varlen([2048] * 16, 32, 8, 128, True)
