"""The one-kernel backward ("dkdv_dq") with dQ cast by the last CTA to add to each query tile
(CAST_DQ) against the package's cast launch after the kernel, and cuDNN's backward, in one
process: bf16, rotating rounds of CUDA-graph replays (cuDNN eager). First a check on
poisoned outputs (dQ filled with NaN before the launch, so a query tile nobody cast shows),
then the timings. CAST_DQ is not in the package: run it with cast-dq-per-turn.diff applied
(`git apply`), as the logged run was."""
import dataclasses
import math
import statistics
import sys

import torch
import triton.testing
from torch.nn.attention.bias import causal_lower_right

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import BackwardEntry, backward_entry_for
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, launch_gradient_kernels
from cutile_fmha.steps.launcher import device_facts

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
PARTS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["checks", "128", "other"]
CHECKS = [  # B, H, H_kv, N_q, N_k, D, causal
    (2, 4, 4, 1000, 1000, 128, True), (2, 4, 2, 1000, 1000, 128, False),
    (1, 4, 4, 700, 1300, 128, True), (1, 4, 4, 1300, 700, 128, True), (1, 4, 2, 300, 2000, 128, True),
    (2, 4, 4, 1000, 1000, 64, True), (1, 8, 2, 777, 1500, 64, False),
    (2, 4, 4, 1000, 1000, 256, True), (1, 4, 4, 513, 700, 256, False),
    (1, 2, 2, 65536, 4096, 128, False),  # chunks of queries
    (1, 2, 2, 64, 64, 128, True), (1, 2, 2, 1, 1, 128, True), (1, 2, 2, 1, 300, 64, False),
]
SHAPES = [  # B, H, H_kv, N, D, causal
    (4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False),
    (2, 32, 32, 8192, 128, True), (4, 32, 16, 4096, 128, True),
    (4, 32, 32, 1024, 128, True),
    (4, 32, 32, 8192, 64, True), (4, 32, 32, 8192, 64, False),
    (4, 16, 16, 4096, 256, True), (4, 16, 16, 4096, 256, False),
]


def with_cast(entry: BackwardEntry, cast: bool) -> BackwardEntry:
    launches = {d: {name: dataclasses.replace(launch, cast_dq=cast) if name == "dkdv_dq"
                    else launch for name, launch in kernels.items()}
                for d, kernels in entry.launches.items()}
    exact = {d: {name: dataclasses.replace(launch, cast_dq=cast) for name, launch in ks.items()}
             for d, ks in entry.exact_launches.items()}
    return dataclasses.replace(entry, launches=launches, exact_launches=exact)


def backward(q, k, v, out, lse, do, causal, entry, poison=False):
    dq = torch.full_like(q, math.nan) if poison else torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    tensors = {"Q": q, "K": k, "V": v, "dO": do, "Lse": lse, "Out": out, "Delta": None,
               "dK": dk, "dV": dv, "dQ": dq, "qk_scale": q.shape[-1] ** -0.5,
               "query_offset": k.shape[2] - q.shape[2] if causal else 0}
    launch_gradient_kernels(BACKWARD_FAMILIES, tensors, causal=causal, entry=entry)
    return dq, dk, dv


def inputs(b, h, hkv, nq, nk, d, causal):
    gen = torch.Generator(device="cuda").manual_seed(nq * 7 + nk + h + d)
    q = torch.randn(b, h, nq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, hkv, nk, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    mask = causal_lower_right(nq, nk) if causal and nq != nk else None
    out, lse = attention_with_lse(q, k, v, attn_mask=mask, is_causal=causal and mask is None,
                                  enable_gqa=hkv != h)
    return q, k, v, out, lse, torch.randn_like(out)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    base = backward_entry_for(device_facts(torch.device("cuda"))[0])
    entries = {"package": with_cast(base, False), "cast in kernel": with_cast(base, True)}
    for b, h, hkv, nq, nk, d, causal in CHECKS if "checks" in PARTS else []:
        args = inputs(b, h, hkv, nq, nk, d, causal)
        old = backward(*args, causal, entries["package"], poison=True)
        new = backward(*args, causal, entries["cast in kernel"], poison=True)
        diffs = [((a.float() - o.float()).abs().max() / o.float().abs().max().clamp(min=1e-6)).item()
                 for a, o in zip(new, old)]
        nans = [int(t.isnan().sum()) for t in new + old]
        print(f"check B={b} H={h}/{hkv} Nq={nq} Nk={nk} D={d} causal={causal}: relative max "
              f"diff dq/dk/dv {diffs[0]:.1e}/{diffs[1]:.1e}/{diffs[2]:.1e}, NaN new {nans[:3]} "
              f"old {nans[3:]}", flush=True)
    for b, h, hkv, n, d, causal in SHAPES:
        if ("128" if d == 128 else "other") not in PARTS:
            continue
        q, k, v, out, lse, do = inputs(b, h, hkv, n, n, d, causal)
        timers = {name: (lambda e=e: triton.testing.do_bench_cudagraph(
            lambda: backward(q, k, v, out, lse, do, causal, e), rep=100))
            for name, e in entries.items()}
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(
                *leaves, is_causal=causal, enable_gqa=hkv != h)
        timers["cudnn"] = lambda: triton.testing.do_bench(
            lambda: torch.autograd.grad(ref, leaves, do, retain_graph=True), rep=100)
        names, times = list(timers), {name: [] for name in timers}
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(timers[name]())
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"B={b} H={h}/{hkv} N={n} D={d} causal={causal}: "
              + ", ".join(f"{name} {med[name]:.4f} ms ({min(times[name]):.4f}-"
                          f"{max(times[name]):.4f})" for name in names)
              + f"; new / old {med['cast in kernel'] / med['package']:.3f}"
              + f"; cudnn / new {med['cudnn'] / med['cast in kernel']:.3f}", flush=True)


main()
