"""How fast can anything read a decode step's KV cache? Plain reads of the same K/V bytes
beside attention_with_kvcache and SDPA's cuDNN and flash backends, in rotating rounds.

    python docs/results/read-ceiling/read_ceiling.py [--rounds 5]

Readers of the (2, batch, kv_heads, keys, D) bf16 cache (K and V are its two halves):
- "cuTile read": the decode kernel's grid and loads without its products: a CTA per
  (split, K/V head, sequence) loads every (128, D) tile of K and V by TMA and sums them.
- "triton read, P programs x B": a grid-stride loop of B-element blocks over both halves.
- "torch sum": ``cache.sum(dtype=float32)``, one reduction kernel.
Every reader's sum is checked against the cache's, so no read is left out.
"""

import argparse
import statistics

import cuda.tile as ct
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from tabulate import tabulate
from triton.testing import do_bench_cudagraph

from cutile_fmha.assets import measure
from cutile_fmha.kernels.common import ConstInt

HBM_PEAK = {"H100": 3.35e12, "H200": 4.8e12}
TILE_N, HEAD_DIM, KV_HEADS, HEADS = 128, 128, 8, 32


@ct.kernel(occupancy=2)
def cutile_read(K, V, Out, TILE_N: ConstInt, TILE_D: ConstInt):
    split, kv_head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    num_tiles = ct.cdiv(K.shape[2], TILE_N)
    per_split = ct.cdiv(num_tiles, ct.num_blocks(0))
    lo, hi = split * per_split, min(num_tiles, (split + 1) * per_split)
    acc = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    for tile in range(lo, hi):
        k = ct.load(K, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, TILE_D),
                    latency=4).reshape((TILE_N, TILE_D))
        v = ct.load(V, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, TILE_D),
                    latency=4).reshape((TILE_N, TILE_D))
        acc = acc + k.astype(ct.float32) + v.astype(ct.float32)
    ct.store(Out, index=(batch, kv_head, split, 0),
             tile=ct.sum(acc, axis=0).reshape((1, 1, 1, TILE_D)))


@triton.jit
def triton_read(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid, programs = tl.program_id(0), tl.num_programs(0)
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(pid * BLOCK, n, programs * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offsets, mask=offsets < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc))


def readers(cache, sms):
    _, batch, kv_heads, keys, dim = cache.shape
    k, v = cache[0], cache[1]
    out = {}
    for splits in (1,):
        partial = torch.empty(batch, kv_heads, splits, dim, device="cuda", dtype=torch.float32)

        def read(splits=splits, partial=partial):
            ct.launch(torch.cuda.current_stream(), (splits, kv_heads, batch), cutile_read,
                      (k, v, partial, TILE_N, dim))
            return partial
        out[f"cuTile read, {splits} split"] = read
    flat = cache.view(-1)
    for programs, block in ((8 * sms, 4096), (16 * sms, 2048)):
        partial = torch.empty(programs, device="cuda", dtype=torch.float32)

        def read(programs=programs, block=block, partial=partial):
            triton_read[(programs,)](flat, partial, flat.numel(), BLOCK=block, num_warps=8)
            return partial
        out[f"triton read, {programs} programs x {block}"] = read
    out["torch sum"] = lambda: cache.sum(dtype=torch.float32)
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", default="16x4096,16x8192,64x4096")
    args = parser.parse_args()
    from cutile_fmha import attention_with_kvcache
    name = torch.cuda.get_device_name()
    peak = next(p for key, p in HBM_PEAK.items() if key in name)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{name}, {sms} SMs, HBM peak {peak / 1e12} TB/s; {measure.run_context()}")
    rows = []
    for shape in args.shapes.split(","):
        batch, keys = map(int, shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(batch + keys)
        cache = torch.randn(2, batch, KV_HEADS, keys, HEAD_DIM, device="cuda",
                            dtype=torch.bfloat16, generator=g)
        query = torch.randn(batch, HEADS, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16,
                            generator=g)
        lengths = torch.full((batch,), keys, device="cuda", dtype=torch.int32)
        k, v = cache[0], cache[1]
        fns = {"ours (attention_with_kvcache)": lambda: attention_with_kvcache(query, k, v, lengths),
               # the same kernel without cache_seqlens: no length read before the first load
               "ours, cache_seqlens=None": lambda: attention_with_kvcache(query, k, v, None)}
        for backend, label in ((torch.nn.attention.SDPBackend.CUDNN_ATTENTION, "SDPA cuDNN"),
                               (torch.nn.attention.SDPBackend.FLASH_ATTENTION, "SDPA flash")):
            def sdpa(backend=backend):
                with torch.nn.attention.sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(query, k, v, enable_gqa=True)
            fns[label] = sdpa
        fns.update(readers(cache, sms))
        total = cache.double().sum().item()
        for label, fn in fns.items():
            result = fn()
            if "read" in label or "sum" in label:
                got = result.double().sum().item()
                assert abs(got - total) <= 1e-3 * cache.numel() ** 0.5 + 1e-4 * abs(total), \
                    (label, got, total)
        reference = F.scaled_dot_product_attention(query.double(), k.double(), v.double(),
                                                    enable_gqa=True)
        for label in ("ours (attention_with_kvcache)", "ours, cache_seqlens=None"):
            error = (fns[label]().double() - reference).abs().max().item()
            assert error < 2e-2, (label, error)
        labels = list(fns)
        times = measure.time_in_rounds([fns[label] for label in labels], args.rounds,
                                       lambda fn: do_bench_cudagraph(fn, rep=50))
        read = cache.numel() * cache.element_size()
        best_read = min(statistics.median(t) for label, t in zip(labels, times)
                        if "read" in label or "sum" in label)
        for label, t in zip(labels, times):
            ms = statistics.median(t)
            rows.append({"batch x keys": shape, "reader": label, "us": round(ms * 1e3, 2),
                         "spread us": f"{min(t) * 1e3:.2f}-{max(t) * 1e3:.2f}",
                         "TB/s": round(read / ms / 1e9, 3),
                         "% of peak": round(100 * read / ms / 1e-3 / peak, 1),
                         "time / best plain read": round(ms / best_read, 3)})
        print(tabulate([r for r in rows if r["batch x keys"] == shape], headers="keys",
                       tablefmt="github"), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
