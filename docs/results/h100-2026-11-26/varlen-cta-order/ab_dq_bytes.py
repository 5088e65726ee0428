"""The backward's causal CTA groups counting dQ's float32 rows (what the one kernel adds to
in L2) in a pair's bytes ("new"), against the same without ("mid", cutile_fmha_mid: the
variable-length kernels already in the dense kernels' order; its dense kernels are the
committed ones). bf16, causal, three rotating rounds of CUDA-graph replays in one process.
One JSON line per case."""
import json, statistics
import torch, triton.testing as tt
import cutile_fmha as new
from cutile_fmha.steps import backward as new_backward, varlen as new_varlen
from cutile_fmha_mid.steps import backward as mid_backward, varlen as mid_varlen

MODULES = {"new": (new_backward, new_varlen), "mid": (mid_backward, mid_varlen)}


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def timed(label, fns):
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    check = {n: max(rel(a, b) for a, b in zip(grads[n], grads["mid"])) for n in grads}
    times = {n: [] for n in fns}
    names = list(fns)
    for r in range(3):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(tt.do_bench_cudagraph(fns[n], rep=60))
    med = {n: statistics.median(t) for n, t in times.items()}
    print(json.dumps({"case": label, "ms": med, "over_mid": {n: m / med["mid"] for n, m in med.items()},
                      "max_rel_diff_vs_mid": check, "rounds": times}), flush=True)


def dense(B, H, HKV, N, D):
    g = torch.Generator(device="cuda").manual_seed(N + H + HKV + D)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = new.attention_with_lse(q, k, v, is_causal=True, enable_gqa=HKV != H)
    timed(f"backward B={B} H={H}/{HKV} N={N} D={D} causal",
          {n: (lambda m=m: m[0].attention_backward(q, k, v, out, lse, do, causal=True)) for n, m in MODULES.items()})


def packed(lengths, H, HKV, D):
    g = torch.Generator(device="cuda").manual_seed(len(lengths) + H + D)
    total = sum(lengths)
    q, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    views = [t.transpose(0, 1)[None] for t in (q, k, v, do)]
    m = max(lengths)
    bounds = new_varlen.SequenceBounds.packed(cu, cu)
    out, lse = new_varlen.varlen_forward(*views[:3], bounds, m, causal=True, scale=D ** -0.5, with_lse=True)
    fns = {}
    for n, (_, module) in MODULES.items():
        b = module.SequenceBounds.packed(cu, cu)
        fns[n] = lambda module=module, b=b: module.varlen_backward(*views[:3], out, lse, views[3], b, m, m,
                                                                    causal=True, scale=D ** -0.5)
    timed(f"packed backward {len(lengths)} x {m} H={H}/{HKV} D={D} causal", fns)


print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
for shape in ((4, 16, 16, 4096, 256), (4, 16, 4, 4096, 256), (4, 32, 32, 8192, 64), (4, 64, 8, 2048, 64),
              (4, 32, 32, 4096, 128), (4, 16, 4, 2048, 128)):
    dense(*shape)
packed([4096] * 4, 16, 16, 256)
packed([2048] * 4, 16, 4, 128)
packed([1024] * 8, 32, 32, 64)
packed([2048] * 16, 32, 8, 128)
