"""The chunked D=128 backward without the mask, its dK/dV sums added by the kernel
(ADD_TO_DKDV: two float32 tensors of K's shape) against the form before
(backward_at_937bea2.py: each chunk's float32 dK/dV written apart and added by PyTorch, four
such tensors) and one launch over every query, on one GPU: B=1, H=32, D=128, bf16, three
rotating rounds, CUDA events. Prints times, TFLOPS, the peak memory each backward allocates
beyond its inputs and outputs, and the largest difference of the gradients.
Run: python chunk_sums_ab.py"""

import dataclasses
import os
import sys

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import attention_backward

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import backward_at_937bea2 as before  # noqa: E402

entry = backward_entry_for("sm_90")
ONE_LAUNCH = dataclasses.replace(entry, launches=entry.launches | {
    128: entry.launches[128] | {"dkdv_dq": dataclasses.replace(entry.launches[128]["dkdv_dq"],
                                                               chunk_query_rows=None)}})
METHODS = {"kernel adds (now)": lambda *a: attention_backward(*a),
           "PyTorch adds (937bea2)": lambda *a: before.attention_backward(*a),
           "one launch": lambda *a: attention_backward(*a, entry=ONE_LAUNCH)}


def timed_ms(fn, iterations=2):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iterations


for n in (65536, 131072):
    torch.manual_seed(0)
    q, k, v, grad = (torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16)
                     for _ in range(4))
    out, lse = attention_with_lse(q, k, v)
    inputs = (q, k, v, out, lse, grad)
    results = {}
    for name, fn in METHODS.items():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        results[name] = fn(*inputs)
        torch.cuda.synchronize()
        outputs = sum(t.numel() * t.element_size() for t in results[name])
        extra = (torch.cuda.max_memory_allocated() - base - outputs) / 2**30
        print(f"{n}x{n} {name}: {extra:.2f} GiB beyond inputs and outputs", flush=True)
    for name, grads in results.items():
        diffs = [((g.float() - r.float()).abs().max() / r.float().abs().max()).item()
                 for g, r in zip(grads, results["PyTorch adds (937bea2)"])]
        print(f"{n}x{n} {name}: dq, dk, dv against 937bea2's, largest difference over the "
              f"largest entry {', '.join(f'{d:.2g}' for d in diffs)}", flush=True)
    del results
    times = {name: [] for name in METHODS}
    for _ in range(3):
        for name, fn in METHODS.items():
            times[name].append(timed_ms(lambda: fn(*inputs)))
    flops = 2.5 * 4 * 32 * n * n * 128
    now = min(times["kernel adds (now)"])
    for name, values in times.items():
        best = min(values)
        print(f"{n}x{n} {name}: {best:.1f} ms (rounds {', '.join(f'{t:.1f}' for t in values)}), "
              f"{flops / best / 1e9:.0f} TFLOPS, time over the kernel's adds {best / now:.3f}",
              flush=True)
    del q, k, v, grad, out, lse
