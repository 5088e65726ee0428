"""Paged caches at D=96 and 80 from batch 64 took 1.12-1.43x the dense time (D=128: 1.01).
Hypothesis: one key row's heads are adjacent (blocks, block_size, kv_heads, D), so at 192
or 160 bytes a head a 128-byte L2 line holds two heads' rows, read by two CTAs; when they
drift apart the line is fetched twice. Probe: the same cache as a view of a 128-column
allocation ([..., :D]: each head's row on its own lines), against the contiguous one and
the dense cache; q_len 1, 32/8 heads, bf16, rotating rounds of CUDA-graph replays."""
import statistics

import torch
from triton.testing import do_bench_cudagraph

from cutile_fmha import attention_with_kvcache

ROUNDS = 5
print(torch.cuda.get_device_name(), flush=True)
heads, kv_heads, dtype = 32, 8, torch.bfloat16
for head_dim in (96, 80, 128):
    for batch, cache in [(64, 32768), (64, 8192), (16, 32768)]:
        g = torch.Generator(device="cuda").manual_seed(batch + cache)
        q = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=dtype, generator=g)
        dense = [torch.randn(batch, kv_heads, cache, head_dim, device="cuda", dtype=dtype,
                             generator=g) for _ in range(2)]
        lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        calls = {"dense": lambda: attention_with_kvcache(q, *dense, lengths)}
        for block in (16, 64):
            per = cache // block
            table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
            for label, width in (("contiguous", head_dim), ("rows on own lines", 128)):
                if width == head_dim and label != "contiguous":
                    continue
                paged = []
                for d in dense:
                    t = torch.empty(batch * per, block, kv_heads, width, device="cuda", dtype=dtype)
                    t[table.flatten().long(), ..., :head_dim] = d.reshape(
                        batch, kv_heads, per, block, head_dim).permute(0, 2, 3, 1, 4).reshape(
                        batch * per, block, kv_heads, head_dim)
                    paged.append(t[..., :head_dim])
                calls[f"paged {block}, {label}"] = (
                    lambda paged=paged, table=table:
                    attention_with_kvcache(q, *paged, lengths, block_table=table))
        base = calls["dense"]().float()
        for label, fn in calls.items():
            assert (fn().float() - base).abs().max().item() < 1e-2, label
        times = {label: [] for label in calls}
        for r in range(ROUNDS):
            order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
            for label in order:
                times[label].append(do_bench_cudagraph(calls[label], rep=30))
        med = {label: statistics.median(t) for label, t in times.items()}
        for label in calls:
            print(f"D={head_dim} batch {batch} x {cache}: {label:28s} {med[label] * 1e3:9.1f} us "
                  f"[{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
                  f"/dense {med[label] / med['dense']:.3f}", flush=True)
        del calls
        torch.cuda.empty_cache()
