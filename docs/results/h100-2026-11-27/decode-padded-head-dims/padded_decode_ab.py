"""attention_with_kvcache at head dims on padded tiles (80, 96; 192/128) in the decode kernel,
against the route such calls took before (the variable-length kernel on the dense cache,
``kvcache._through_varlen``), SDPA's cuDNN backend and D=128 on the same shape, in rotating
rounds of CUDA-graph replays. q_len 1, 32/8 heads, bf16, full lengths; paged caches (blocks
of 16 and 64) in the decode kernel only. Outputs compared with the old route's first."""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph

from cutile_fmha import attention_with_kvcache, kvcache
from cutile_fmha.steps.variants import NO_VARIANTS

ROUNDS = 5
PEAK = {"H100": 3.35e12, "H200": 4.8e12}
name = torch.cuda.get_device_name()
peak = next(v for k, v in PEAK.items() if k in name)
print(name, torch.__version__, flush=True)
heads, kv_heads, dtype = 32, 8, torch.bfloat16
rows = []
for head_dim, value_dim in [(96, 96), (80, 80), (192, 128), (128, 128)]:
    for batch, cache in [(1, 4096), (1, 32768), (16, 4096), (16, 32768), (64, 8192)]:
        g = torch.Generator(device="cuda").manual_seed(batch + cache)
        q = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=dtype, generator=g)
        k = torch.randn(batch, kv_heads, cache, head_dim, device="cuda", dtype=dtype, generator=g)
        v = torch.randn(batch, kv_heads, cache, value_dim, device="cuda", dtype=dtype, generator=g)
        lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        scale = head_dim ** -0.5
        calls = {
            "decode": lambda: attention_with_kvcache(q, k, v, lengths),
            "varlen route": lambda: kvcache._through_varlen(q, k, v, lengths, None, True, scale,
                                                            False, NO_VARIANTS, None)[0],
        }

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        calls["cuDNN"] = cudnn
        for block in (16, 64):
            per = cache // block
            table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
            kp = torch.empty(batch * per, block, kv_heads, head_dim, device="cuda", dtype=dtype)
            vp = torch.empty(batch * per, block, kv_heads, value_dim, device="cuda", dtype=dtype)
            for t, d in ((kp, k), (vp, v)):  # the dense cache's rows, in the table's blocks
                t[table.flatten().long()] = d.reshape(batch, kv_heads, per, block, -1) \
                    .permute(0, 2, 3, 1, 4).reshape(batch * per, block, kv_heads, -1)
            calls[f"paged {block}"] = (lambda kp=kp, vp=vp, table=table:
                                       attention_with_kvcache(q, kp, vp, lengths, block_table=table))
        if head_dim == 128:
            del calls["varlen route"]
        base = calls.get("varlen route", calls["decode"])().float()
        errors = {}
        for label, fn in calls.items():
            try:
                errors[label] = (fn().float() - base).abs().max().item()
            except Exception as error:
                print(label, "failed:", str(error).splitlines()[0][:200], flush=True)
        calls = {label: fn for label, fn in calls.items() if label in errors}
        times = {label: [] for label in calls}
        for r in range(ROUNDS):
            order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
            for label in order:
                times[label].append(do_bench_cudagraph(calls[label], rep=30))
        read = batch * kv_heads * cache * (head_dim + value_dim) * 2
        med = {label: statistics.median(t) * 1e-3 for label, t in times.items()}
        for label in calls:
            print(f"D={head_dim}/{value_dim} batch {batch} x {cache}: {label:12s} "
                  f"{med[label] * 1e6:9.1f} us [{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
                  f"{100 * read / med[label] / peak:5.1f}% of peak, /decode {med[label] / med['decode']:.3f}, "
                  f"max |diff| {errors[label]:.2e}", flush=True)
        torch.cuda.empty_cache()
