"""Batch 1 decode on small caches, D 64/128/256, 32/8 heads, q_len 1 and 4, bf16: GPU time
in CUDA graphs (do_bench_cudagraph, 5 rotating rounds) for num_splits None (the rule), 1, 2
and 4, with cuDNN beside (SDPA on the cache, GQA); and host time per call without graphs of
the rule against one split (alternating pairs, the order swapped every pair). One JSON line
per shape."""
import json, statistics, sys, time
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph
import cutile_fmha as fm
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.launcher import device_facts

dev, dt = "cuda", torch.bfloat16
clock = time.perf_counter_ns
ARCH, SMS = device_facts(torch.device(dev))
print(json.dumps({"gpu": torch.cuda.get_device_name(), "sms": SMS}), flush=True)


def cudnn(q, kc, vc):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)


def host_pairs(a_fn, b_fn, pairs):
    for f in (a_fn, b_fn):
        for _ in range(300):
            f()
    a, b = [], []
    for i in range(pairs):
        if i % 100 == 0:
            torch.cuda.synchronize()
        first, second = (a_fn, b_fn) if i % 2 else (b_fn, a_fn)
        t0 = clock(); first(); t1 = clock(); second(); t2 = clock()
        x, y = (t1 - t0, t2 - t1) if i % 2 else (t2 - t1, t1 - t0)
        a.append(x); b.append(y)
    torch.cuda.synchronize()
    return statistics.median(a) / 1e3, statistics.median(b) / 1e3


heads = [int(x) for x in sys.argv[1:]] or [64, 128, 256]
for d in heads:
    for q_len in (1, 4):
        for n in ((256, 384, 512, 768, 1024) if q_len == 1 else (512,)):
            g = torch.Generator(device=dev).manual_seed(n + d)
            q = torch.randn(1, 32, q_len, d, device=dev, dtype=dt, generator=g)
            kc = torch.randn(1, 8, n, d, device=dev, dtype=dt, generator=g)
            vc = torch.randn_like(kc)
            lens = torch.full((1,), n, dtype=torch.int32, device=dev)
            calls = {f"splits {s}": (lambda s=s: fm.attention_with_kvcache(q, kc, vc, lens, num_splits=s))
                     for s in (None, 1, 2, 4)}
            if q_len == 1:
                calls["cuDNN"] = lambda: cudnn(q, kc, vc)
            ref = calls["splits 1"]().float()
            err = {k: float((f().float() - ref).abs().max()) for k, f in calls.items()}
            times = {k: [] for k in calls}
            names = list(calls)
            for r in range(5):
                for k in names[r % len(names):] + names[:r % len(names)]:
                    times[k].append(do_bench_cudagraph(calls[k], rep=40) * 1e3)
            rule_host, one_host = host_pairs(calls["splits None"], calls["splits 1"], 6000)
            print(json.dumps({"D": d, "q_len": q_len, "keys": n, "rule_splits": entry_for(ARCH).decode[d].splits(8, n, SMS),
                              "gpu_us": {k: round(statistics.median(v), 2) for k, v in times.items()},
                              "host_us": {"rule": round(rule_host, 2), "1 split": round(one_host, 2)},
                              "max_err_vs_1_split": err}), flush=True)
