"""Decode-kernel loads of head dims below their tile's width: one padded TMA load (the
committed package, a copy `cutile_fmha_old`) against pieces (the working tree): the
tile's first half of the columns and the rest as a second load of a power-of-two width,
zeros past it. (First form: both K and V in pieces joined into the padded tile with
ct.cat; second: K's pieces as two products into S^T, V as before.) 32/8 heads,
bf16, full lengths, 5 rotating rounds of CUDA-graph replays; dense caches and paged in
blocks of 64 and 16; D=128 as a control (same kernel)."""
import statistics

import torch
from triton.testing import do_bench_cudagraph

import cutile_fmha
import cutile_fmha_old

ROUNDS = 5
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
HEADS, KV_HEADS = 32, 8
print(torch.cuda.get_device_name(), flush=True)
for (d, dv), q_len, shapes in [((80, 80), 1, [(16, 32768), (64, 8192), (16, 4096), (1, 32768)]),
                               ((96, 96), 1, [(16, 32768), (64, 8192)]),
                               ((192, 128), 1, [(16, 32768)]),
                               ((72, 72), 1, [(16, 32768)]),
                               ((80, 80), 4, [(16, 32768)])]:
    for batch, keys in shapes:
        g = torch.Generator(device="cuda").manual_seed(d + batch + keys)
        q = torch.randn(batch, HEADS, q_len, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(batch, KV_HEADS, keys, d, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(batch, KV_HEADS, keys, dv, device="cuda", dtype=torch.bfloat16, generator=g)
        lengths = torch.full((batch,), keys, dtype=torch.int32, device="cuda")
        calls = {}
        for name, package in (("old", cutile_fmha_old), ("new", cutile_fmha)):
            calls[f"dense {name}"] = (lambda package=package:
                                      package.attention_with_kvcache(q, k, v, lengths,
                                                                     is_causal=True))
        for block in (64, 16):
            per = keys // block
            table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
            paged = []
            for t, width in ((k, d), (v, dv)):
                c = torch.empty(batch * per, block, KV_HEADS, width, device="cuda", dtype=t.dtype)
                c[table.flatten().long()] = t.reshape(batch, KV_HEADS, per, block, width) \
                    .permute(0, 2, 3, 1, 4).reshape(batch * per, block, KV_HEADS, width)
                paged.append(c)
            for name, package in (("old", cutile_fmha_old), ("new", cutile_fmha)):
                calls[f"paged {block} {name}"] = (
                    lambda package=package, paged=paged, table=table:
                    package.attention_with_kvcache(q, *paged, lengths, block_table=table,
                                                   is_causal=True))
        outs = {label: fn().float() for label, fn in calls.items()}
        base = outs["dense old"]
        diffs = {label: (o - base).abs().max().item() for label, o in outs.items()}
        times = {label: [] for label in calls}
        for r in range(ROUNDS):
            order = list(calls)[r % len(calls):] + list(calls)[:r % len(calls)]
            for label in order:
                times[label].append(do_bench_cudagraph(calls[label], rep=30))
        med = {label: statistics.median(t) for label, t in times.items()}
        nbytes = k.numel() * 2 + v.numel() * 2
        for label in calls:
            kind = label.rsplit(" ", 1)[0]
            print(f"D={d}/{dv} q_len {q_len} batch {batch} x {keys}: {label:14s} "
                  f"{med[label] * 1e3:8.1f} us [{min(times[label]) * 1e3:.1f}-{max(times[label]) * 1e3:.1f}] "
                  f"{nbytes / (med[label] * 1e-3) / PEAK * 100:5.1f}% of peak, "
                  f"new/old {med[kind + ' new'] / med[kind + ' old']:.3f}, "
                  f"max |diff| from dense old {diffs[label]:.1e}, "
                  f"equal to old: {torch.equal(outs[kind + ' new'], outs[kind + ' old'])}",
                  flush=True)
        del calls, outs, paged, q, k, v
        torch.cuda.empty_cache()
