"""Head dims 80, 96 and 112, which run D=128's backward launch and so its chunked queries
without the mask: the chunks (16384 query rows per K/V head from 65536) against one launch
over every query, on one GPU: B=1, H=32, bf16, three rotating rounds, CUDA events.
Prints times, TFLOPS and the largest difference of the gradients.
Run: python chunks_d80_112.py"""

import dataclasses

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import attention_backward

entry = backward_entry_for("sm_90")
ONE_LAUNCH = dataclasses.replace(entry, launches=entry.launches | {
    128: entry.launches[128] | {"dkdv_dq": dataclasses.replace(entry.launches[128]["dkdv_dq"],
                                                               chunk_query_rows=None)}})


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


for head_dim in (80, 96, 112):
    for n in (65536, 131072):
        torch.manual_seed(0)
        q, k, v, grad = (torch.randn(1, 32, n, head_dim, device="cuda", dtype=torch.bfloat16)
                         for _ in range(4))
        out, lse = attention_with_lse(q, k, v)
        methods = {"chunks": lambda: attention_backward(q, k, v, out, lse, grad),
                   "one launch": lambda: attention_backward(q, k, v, out, lse, grad,
                                                            entry=ONE_LAUNCH)}
        chunked, single = (fn() for fn in methods.values())
        diffs = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                 for a, b in zip(chunked, single)]
        del chunked, single
        times = {name: [] for name in methods}
        for _ in range(3):
            for name, fn in methods.items():
                times[name].append(timed_ms(fn))
        flops = 2.5 * 4 * 32 * n * n * head_dim
        best = {name: min(values) for name, values in times.items()}
        for name, values in times.items():
            print(f"D={head_dim} {n}x{n} {name}: {best[name]:.1f} ms (rounds "
                  f"{', '.join(f'{t:.1f}' for t in values)}), {flops / best[name] / 1e9:.0f} TFLOPS",
                  flush=True)
        print(f"D={head_dim} {n}x{n}: chunks / one launch {best['chunks'] / best['one launch']:.3f}; "
              f"dq, dk, dv differ by {', '.join(f'{d:.2g}' for d in diffs)} of their largest "
              f"entries", flush=True)
        del q, k, v, grad, out, lse, methods
        torch.cuda.empty_cache()
