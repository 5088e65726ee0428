"""Chunked prefill through attention_with_kvcache: the column tiles in launch order (the
committed kernel, a package copy `cutile_fmha_old`) against the last rows of each head's
chunk first, tiles past the chunk's rows reading no keys (the working tree). Same shapes as
decode-column-tiles/chunk_ab.py plus chunks that are not powers of two; attention() with
`causal_lower_right` on the same dense cache as the reference; 32/8 heads, D=128, bf16,
full lengths, causal, 5 rotating rounds of CUDA-graph replays."""
import statistics

import torch
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench_cudagraph

import cutile_fmha
import cutile_fmha_old

ROUNDS = 5
print(torch.cuda.get_device_name(), flush=True)
heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
for batch, q_len, cache in [(1, 4096, 4096), (4, 512, 4096), (1, 512, 8192), (1, 2048, 32768),
                            (8, 128, 8192), (1, 300, 4096), (2, 1000, 8192), (1, 2500, 4096)]:
    g = torch.Generator(device="cuda").manual_seed(q_len + cache)
    q = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(batch, kv_heads, cache, head_dim, device="cuda", dtype=dtype,
                        generator=g) for _ in range(2))
    lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    mask = causal_lower_right(q_len, cache)
    calls = {"attention()": lambda: cutile_fmha.attention(q, k, v, attn_mask=mask,
                                                          enable_gqa=True)}
    block = 64
    per = cache // block
    table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
    paged = []
    for d in (k, v):
        t = torch.empty(batch * per, block, kv_heads, head_dim, device="cuda", dtype=dtype)
        t[table.flatten().long()] = d.reshape(batch, kv_heads, per, block, head_dim) \
            .permute(0, 2, 3, 1, 4).reshape(batch * per, block, kv_heads, head_dim)
        paged.append(t)
    for name, package in (("launch order", cutile_fmha_old), ("last rows first", cutile_fmha)):
        calls[f"dense, {name}"] = (lambda package=package:
                                   package.attention_with_kvcache(q, k, v, lengths))
        calls[f"paged 64, {name}"] = (lambda package=package:
                                      package.attention_with_kvcache(q, *paged, lengths,
                                                                     block_table=table))
    outputs = {label: fn().float() for label, fn in calls.items()}
    base = outputs["attention()"]
    errors = {label: (o - base).abs().max().item() for label, o in outputs.items()}
    same = {f"{kind}": torch.equal(outputs[f"{kind}, launch order"],
                                   outputs[f"{kind}, last rows first"])
            for kind in ("dense", "paged 64")}
    times = {label: [] for label in calls}
    for r in range(ROUNDS):
        order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
        for label in order:
            times[label].append(do_bench_cudagraph(calls[label], rep=30))
    med = {label: statistics.median(t) for label, t in times.items()}
    pairs = batch * heads * (q_len * cache - q_len * (q_len - 1) / 2)
    for label in calls:
        print(f"batch {batch}, {q_len} new of {cache} keys: {label:26s} {med[label] * 1e3:9.1f} us "
              f"[{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
              f"{4 * pairs * head_dim / med[label] / 1e9:6.1f} TFLOPS, "
              f"/attention() {med[label] / med['attention()']:.3f}, max |diff| {errors[label]:.2e}",
              flush=True)
    for kind in ("dense", "paged 64"):
        print(f"  {kind}: new / old time {med[f'{kind}, last rows first'] / med[f'{kind}, launch order']:.3f}, "
              f"outputs equal bit for bit: {same[kind]}", flush=True)
    torch.cuda.empty_cache()
