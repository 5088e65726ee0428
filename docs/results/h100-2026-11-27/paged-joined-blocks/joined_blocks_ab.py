"""Paged blocks under a tile's keys on the products' M side: a product per block (committed)
against the tile's blocks joined (``joined`` on the K and V loads, one product per matrix:
joined-blocks.diff, a package copy `cutile_fmha_join` on PYTHONPATH). Chunks past 128
columns (chunked prefill) and speculative decoding's 16/32 new tokens, blocks of 16 and 32,
32/8 heads, D=128, bf16, causal, full lengths; one process, rotating rounds of CUDA-graph
replays, the dense cache beside them. Outputs compared with the dense cache's."""
import statistics

import torch
from triton.testing import do_bench_cudagraph

import cutile_fmha
import cutile_fmha_join

ROUNDS = 5
print(torch.cuda.get_device_name(), flush=True)
heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
for batch, q_len, cache in [(1, 512, 8192), (1, 2048, 32768), (4, 512, 4096), (8, 128, 8192),
                            (16, 32, 4096), (1, 32, 32768), (16, 16, 4096)]:
    g = torch.Generator(device="cuda").manual_seed(q_len + cache)
    q = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(batch, kv_heads, cache, head_dim, device="cuda", dtype=dtype,
                        generator=g) for _ in range(2))
    lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    calls = {"dense": lambda: cutile_fmha.attention_with_kvcache(q, k, v, lengths)}
    for block in (16, 32):
        per = cache // block
        table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
        paged = []
        for d in (k, v):
            t = torch.empty(batch * per, block, kv_heads, head_dim, device="cuda", dtype=dtype)
            t[table.flatten().long()] = d.reshape(batch, kv_heads, per, block, head_dim) \
                .permute(0, 2, 3, 1, 4).reshape(batch * per, block, kv_heads, head_dim)
            paged.append(t)
        for name, package in (("per block", cutile_fmha), ("joined", cutile_fmha_join)):
            calls[f"paged {block}, {name}"] = (
                lambda paged=paged, table=table, package=package:
                package.attention_with_kvcache(q, *paged, lengths, block_table=table))
    base = calls["dense"]().float()
    errors = {label: (fn().float() - base).abs().max().item() for label, fn in calls.items()}
    times = {label: [] for label in calls}
    for r in range(ROUNDS):
        order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
        for label in order:
            times[label].append(do_bench_cudagraph(calls[label], rep=30))
    med = {label: statistics.median(t) for label, t in times.items()}
    for label in calls:
        print(f"batch {batch}, {q_len} new of {cache} keys: {label:20s} {med[label] * 1e3:9.1f} us "
              f"[{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
              f"/dense {med[label] / med['dense']:.3f}, max |diff| {errors[label]:.2e}", flush=True)
    torch.cuda.empty_cache()
