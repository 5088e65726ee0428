"""Chunked prefill through attention_with_kvcache: q_len new tokens past one CTA's 128
columns, in CTAs of 128 (COLUMN_TILES), against attention() on the same dense cache with
the lower-right causal mask (step 9's forward, the fastest dense path), SDPA's cuDNN backend
with the same mask, and a paged cache in blocks of 64 and 16; 32/8 heads, D=128, bf16, full
lengths, rotating rounds of CUDA-graph replays. Outputs compared with attention()'s."""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from triton.testing import do_bench_cudagraph

from cutile_fmha import attention, attention_with_kvcache

ROUNDS = 5
print(torch.cuda.get_device_name(), flush=True)
heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.bfloat16
for batch, q_len, cache in [(1, 512, 8192), (1, 2048, 32768), (4, 512, 4096), (8, 128, 8192),
                            (1, 4096, 4096), (16, 64, 4096)]:
    g = torch.Generator(device="cuda").manual_seed(q_len + cache)
    q = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(batch, kv_heads, cache, head_dim, device="cuda", dtype=dtype,
                        generator=g) for _ in range(2))
    lengths = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    mask = causal_lower_right(q_len, cache)
    calls = {"attention()": lambda: attention(q, k, v, attn_mask=mask, enable_gqa=True),
             "kvcache dense": lambda: attention_with_kvcache(q, k, v, lengths)}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(
                q, k, v, attn_mask=torch.ones(q_len, cache, dtype=torch.bool,
                                              device="cuda").tril(cache - q_len),
                enable_gqa=True)
    calls["cuDNN"] = cudnn
    for block in (64, 16):
        per = cache // block
        table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
        paged = []
        for d in (k, v):
            t = torch.empty(batch * per, block, kv_heads, head_dim, device="cuda", dtype=dtype)
            t[table.flatten().long()] = d.reshape(batch, kv_heads, per, block, head_dim) \
                .permute(0, 2, 3, 1, 4).reshape(batch * per, block, kv_heads, head_dim)
            paged.append(t)
        calls[f"kvcache paged {block}"] = (lambda paged=paged, table=table:
                                           attention_with_kvcache(q, *paged, lengths,
                                                                  block_table=table))
    base = calls["attention()"]().float()
    errors = {}
    for label, fn in list(calls.items()):
        try:
            errors[label] = (fn().float() - base).abs().max().item()
        except Exception as error:
            print(label, "failed:", str(error).splitlines()[0][:200], flush=True)
            del calls[label]
    times = {label: [] for label in calls}
    for r in range(ROUNDS):
        order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
        for label in order:
            times[label].append(do_bench_cudagraph(calls[label], rep=30))
    med = {label: statistics.median(t) for label, t in times.items()}
    pairs = batch * heads * (q_len * cache - q_len * (q_len - 1) / 2)
    for label in calls:
        print(f"batch {batch}, {q_len} new of {cache} keys: {label:18s} {med[label] * 1e3:9.1f} us "
              f"[{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
              f"{4 * pairs * head_dim / med[label] / 1e9:6.1f} TFLOPS, "
              f"/attention() {med[label] / med['attention()']:.3f}, max |diff| {errors[label]:.2e}",
              flush=True)
    torch.cuda.empty_cache()
