"""Batch 1 decode on small caches (32/8 heads, D=128, q_len 1, bf16): GPU time in CUDA graphs
(do_bench_cudagraph, 7 rotating rounds) and host time per call without graphs (paired,
alternating, 10000 pairs against the rule's split) for num_splits None (the rule), 1, 2, 4,
with cuDNN's GPU time beside."""
import statistics, time, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
import cutile_fmha as fm

dev, dt = "cuda", torch.bfloat16
print(torch.cuda.get_device_name(), flush=True)
clock = time.perf_counter_ns


def cudnn(q, kc, vc):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)


for n in (256, 512, 768, 1024, 2048):
    g = torch.Generator(device=dev).manual_seed(n)
    q = torch.randn(1, 32, 1, 128, device=dev, dtype=dt, generator=g)
    kc = torch.randn(1, 8, n, 128, device=dev, dtype=dt, generator=g); vc = torch.randn_like(kc)
    lens = torch.full((1,), n, dtype=torch.int32, device=dev)
    calls = {f"splits {s}": (lambda s=s: fm.attention_with_kvcache(q, kc, vc, lens, num_splits=s))
             for s in (None, 1, 2, 4)}
    calls["cuDNN"] = lambda: cudnn(q, kc, vc)
    ref = calls["splits None"]().float()
    for k, f in calls.items():
        assert (f().float() - ref).abs().max().item() < 2e-2, k
    times = {k: [] for k in calls}
    names = list(calls)
    for r in range(7):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(do_bench_cudagraph(calls[k], rep=50) * 1e3)
    line = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in times.items())
    print(f"cache {n}: GPU us (graph) {line}", flush=True)
    rule, one = calls["splits None"], calls["splits 1"]
    for f in (rule, one):
        for _ in range(300):
            f()
    a, b = [], []
    for i in range(10000):
        if i % 100 == 0:
            torch.cuda.synchronize()
        first, second = (rule, one) if i % 2 else (one, rule)
        t0 = clock(); first(); t1 = clock(); second(); t2 = clock()
        x, y = (t1 - t0, t2 - t1) if i % 2 else (t2 - t1, t1 - t0)
        a.append(x); b.append(y)
    torch.cuda.synchronize()
    print(f"cache {n}: host us per call, rule {statistics.median(a) / 1e3:.1f}, "
          f"1 split {statistics.median(b) / 1e3:.1f}", flush=True)
