"""Decoding from a KV cache: how close ``attention_with_kvcache`` reads it to the memory's peak.

    python assets/fmha_decode_benchmark.py                     # the default grid, bf16, D=128
    python assets/fmha_decode_benchmark.py --batch 1 16 --cache 4096 32768 --json out.json
    python assets/fmha_decode_benchmark.py --q-len 1 4 8 16 --batch 16   # speculative decoding
    python assets/fmha_decode_benchmark.py --head-dim 192 --value-head-dim 128   # DeepSeek's

One query token per sequence (or --q-len new tokens: speculative decoding, each seeing its
cache causally, aligned to the cache's last key) against caches of each length: dense
with equal lengths, dense with ragged lengths (uniform from q_len to the cache length), and
paged (shuffled block tables, block sizes 16/64/256). For each case: the time of one call
(CUDA graph replays, ``triton.testing.do_bench_cudagraph``), the K/V bytes of the real keys
read per second, and that as a fraction of the device's HBM peak; SDPA's cuDNN and flash
backends on the dense equal-length cases (the same rounds), and FlashAttention-4's decode
where ``flash_attn.cute`` can be imported. Cases whose caches would not fit in --max-gib
are skipped with a line.
"""

import argparse
import csv
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F
from tabulate import tabulate
from tqdm import tqdm

from cutile_fmha.assets import measure

# HBM peak per device name, bytes/s (vendor figures).
HBM_PEAK = {"H100 80GB HBM3": 3.35e12, "H100": 3.35e12, "H200": 4.8e12}
HOST_ROUNDS = 9  # --host-time: rounds of 300 calls per entry point, in turns


def hbm_peak(name: str) -> float | None:
    return next((peak for key, peak in HBM_PEAK.items() if key in name), None)


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64, 128])
    parser.add_argument("--cache", type=int, nargs="+", default=[1024, 4096, 32768, 131072])
    parser.add_argument("--heads", type=int, nargs="+", default=[32, 64],
                        help="query heads (8 K/V heads)")
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--value-head-dim", type=int,
                        help="value_cache's head dim, if not --head-dim's (192/128: DeepSeek's)")
    parser.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    parser.add_argument("--block-sizes", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--q-len", type=int, nargs="+", default=[1],
                        help="new tokens per sequence (default 1); SDPA's cases above 1 take "
                             "the causal mask aligned to the last key: cuDNN as a boolean "
                             "mask, flash as its lower-right causal")
    parser.add_argument("--max-gib", type=float, default=40.0,
                        help="skip cases whose K and V caches take more than this")
    parser.add_argument("--host-time", action="store_true",
                        help="instead: the host time per call of attention(), attention_varlen()"
                             " and attention_with_kvcache() on small problems (B=1, Nk 512), "
                             "without CUDA graphs, against SDPA's")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--csv", help="write the rows here")
    return parser.parse_args(argv)


def cases(args):
    for q_len in args.q_len:
        for heads in args.heads:
            for batch in args.batch:
                for cache in args.cache:
                    yield heads, batch, cache, q_len, "dense", None
                    yield heads, batch, cache, q_len, "ragged", None
                    if heads == args.heads[0]:
                        for block_size in args.block_sizes:
                            yield heads, batch, cache, q_len, "paged", block_size


def sdpa_calls(query, keys, values):
    """SDPA's cuDNN and flash backends on the dense equal-length case: one query row sees
    every key; more see the cache causally, aligned to its last key."""
    from torch.nn.attention import SDPBackend, bias, sdpa_kernel

    q_len, cache = query.shape[2], keys.shape[2]
    masks = {SDPBackend.CUDNN_ATTENTION: None, SDPBackend.FLASH_ATTENTION: None}
    if q_len > 1:
        masks = {SDPBackend.CUDNN_ATTENTION: torch.ones(q_len, cache, dtype=torch.bool,
                                                        device=query.device).tril(cache - q_len),
                 SDPBackend.FLASH_ATTENTION: bias.causal_lower_right(q_len, cache)}
    calls = {}
    for backend, name in ((SDPBackend.CUDNN_ATTENTION, "cuDNN"),
                          (SDPBackend.FLASH_ATTENTION, "flash")):
        def sdpa(backend=backend, mask=masks[backend]):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(query, keys, values, attn_mask=mask,
                                                      enable_gqa=True)
        calls[name] = sdpa
    return calls


def time_case(args, heads, batch, cache, q_len, layout, block_size, fa4):
    from triton.testing import do_bench_cudagraph

    from cutile_fmha import attention_with_kvcache

    dtype = getattr(torch, args.dtype)
    kv_heads, head_dim, value_dim = args.kv_heads, args.head_dim, value_head_dim(args)
    generator = torch.Generator(device="cuda").manual_seed(batch * cache)
    query = torch.randn(batch, heads, q_len, head_dim, device="cuda", dtype=dtype,
                        generator=generator)
    if layout == "ragged":
        lengths = torch.randint(q_len, cache + 1, (batch,), device="cuda", generator=generator)
    else:
        lengths = torch.full((batch,), cache, device="cuda")
    lengths = lengths.to(torch.int32)
    if layout == "paged":
        per_sequence = math.ceil(cache / block_size)
        shape = (batch * per_sequence, block_size, kv_heads)
        table = torch.randperm(batch * per_sequence, device="cuda", generator=generator)
        options = {"block_table": table.reshape(batch, per_sequence).int()}
    else:
        shape, options = (batch, kv_heads, cache), {}
    keys, values = (torch.randn(*shape, d, device="cuda", dtype=dtype, generator=generator)
                    for d in (head_dim, value_dim))
    read = kv_heads * (head_dim + value_dim) * dtype.itemsize * lengths.sum().item()
    timings = {"ours": lambda: attention_with_kvcache(query, keys, values, lengths, **options)}
    if layout == "dense":
        timings |= sdpa_calls(query, keys, values)
        if fa4 is not None:  # flash_attn.cute has no flash_attn_with_kvcache: its varlen
            # function takes batched tensors with each sequence's key count (seqused_k);
            # its causal mask is aligned to the last key
            q, k, v = (t.transpose(1, 2) for t in (query, keys, values))
            timings["FA4"] = lambda: fa4.flash_attn_varlen_func(q, k, v, seqused_k=lengths,
                                                                causal=q_len > 1)
    seconds = {}
    for name, fn in timings.items():
        try:
            fn()
            seconds[name] = do_bench_cudagraph(fn, rep=50) * 1e-3
        except Exception as error:  # a backend that refuses a case: say so, keep going
            print(f"{name} failed on {heads}/{batch}/{cache}/{q_len}/{layout}: "
                  f"{measure.one_line(error)}")
    return read, seconds


def value_head_dim(args) -> int:
    return args.value_head_dim or args.head_dim


def host_microseconds(fn, calls: int = 300) -> float:
    """Host time per call of one round: `calls` calls issued back to back (the GPU keeps up
    with tiny problems, so the host is what is timed), then a synchronisation."""
    import time

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def host_times(args) -> list[dict]:
    from cutile_fmha import attention, attention_varlen, attention_with_kvcache

    dtype, head_dim, keys_len = getattr(torch, args.dtype), args.head_dim, 512
    heads, kv_heads = args.heads[0], args.kv_heads
    rows = []
    for q_len in (1, 4, 16, 32, 128):
        query = torch.randn(1, heads, q_len, head_dim, device="cuda", dtype=dtype)
        keys, values = (torch.randn(1, kv_heads, keys_len, head_dim, device="cuda", dtype=dtype)
                        for _ in range(2))
        lengths = torch.full((1,), keys_len, dtype=torch.int32, device="cuda")
        packed = [t[0].transpose(0, 1).contiguous() for t in (query, keys, values)]
        cu_q = torch.tensor([0, q_len], dtype=torch.int32, device="cuda")
        cu_k = torch.tensor([0, keys_len], dtype=torch.int32, device="cuda")
        calls = {
            "SDPA": lambda: F.scaled_dot_product_attention(query, keys, values, enable_gqa=True),
            "attention()": lambda: attention(query, keys, values, enable_gqa=True),
            "attention_varlen()": lambda: attention_varlen(*packed, cu_q, cu_k, q_len, keys_len),
        }
        if q_len * heads // kv_heads <= 128:
            calls["attention_with_kvcache()"] = lambda: attention_with_kvcache(
                query, keys, values, lengths, is_causal=False)
        for fn in calls.values():  # compiles and plans, then warms the host path
            for _ in range(20):
                fn()
        # Rotating rounds, median: a host's speed drifts by several microseconds a call
        # over seconds, and no entry point should always be timed in the same stretch.
        timings = measure.time_in_rounds(list(calls.values()), HOST_ROUNDS, host_microseconds)
        rows.append({"q_len": q_len, "k_len": keys_len, **{
            f"{name} us": round(statistics.median(times), 1)
            for name, times in zip(calls, timings)}})
    return rows


def main(argv=None) -> int:
    args = parse(argv)
    if (problem := measure.gpu_problem("The decode benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    if args.host_time:
        rows = host_times(args)
        print(f"{torch.cuda.get_device_name()}: host time per call, B=1, "
              f"{args.heads[0]}/{args.kv_heads} heads, D={args.head_dim}, no CUDA graph")
        print(tabulate(rows, headers="keys", tablefmt="github"))
        return 0
    name = torch.cuda.get_device_name()
    peak = hbm_peak(name)
    fa4 = measure.flash_attention_4()
    print(f"{name}, HBM peak {peak / 1e12 if peak else float('nan'):.2f} TB/s; {args.dtype}, "
          f"D={args.head_dim}, D_v={value_head_dim(args)}; FA4 "
          f"{'staged' if fa4 else 'not importable: skipped'}")
    rows = []
    for heads, batch, cache, q_len, layout, block_size in tqdm(list(cases(args)), desc="decode"):
        gib = batch * args.kv_heads * cache * (args.head_dim + value_head_dim(args)) * 2 / 2**30
        if gib > args.max_gib:
            tqdm.write(f"skipped {heads}/{args.kv_heads} heads, batch {batch}, cache {cache}: "
                       f"{gib:.0f} GiB of cache > --max-gib {args.max_gib}")
            continue
        read, seconds = time_case(args, heads, batch, cache, q_len, layout, block_size, fa4)
        row = {"heads": f"{heads}/{args.kv_heads}", "batch": batch, "cache": cache,
               "q_len": q_len, "layout": layout + (f" {block_size}" if block_size else "")}
        for backend, time in seconds.items():
            row[f"{backend} us"] = round(time * 1e6, 1)
            row[f"{backend} GB/s"] = round(read / time / 1e9)
        if peak and "ours" in seconds:
            row["ours % peak"] = round(100 * read / seconds["ours"] / peak, 1)
        if "cuDNN" in seconds and "ours" in seconds:
            row["ours / cuDNN time"] = round(seconds["ours"] / seconds["cuDNN"], 3)
        rows.append(row)
        torch.cuda.empty_cache()
    print(tabulate(rows, headers="keys", tablefmt="github"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "hbm_peak": peak, "dtype": args.dtype,
                       "head_dim": args.head_dim, "value_head_dim": value_head_dim(args),
                       "rows": rows}, f, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted({k for row in rows for k in row}))
            writer.writeheader()
            writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
