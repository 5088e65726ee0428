"""The one-kernel backward without the causal mask, its queries in chunks of 16384 rows per
K/V head (chunk_query_rows, here at every head dim) against one launch over all of them, on
one GPU: bf16, rotating rounds, CUDA events. Prints each shape's times, TFLOPS and the
largest difference of the gradients (relative to their largest entry).
Run: python chunked_ab.py [indices of SHAPES to run; all by default]."""

import dataclasses
import sys

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import attention_backward, launches_for, query_chunk_rows
from cutile_fmha.steps.variants import NO_VARIANTS


def with_chunks(rows):
    entry = backward_entry_for("sm_90")
    return dataclasses.replace(entry, launches={
        head_dim: kernels | {"dkdv_dq": dataclasses.replace(kernels["dkdv_dq"],
                                                            chunk_query_rows=rows)}
        for head_dim, kernels in entry.launches.items()})


CHUNKED, ONE_LAUNCH = with_chunks(16384), with_chunks(None)
SHAPES = [  # (heads, kv_heads, q_len, k_len, head_dim)
    (32, 32, 131072, 131072, 128), (32, 32, 65536, 65536, 128), (32, 32, 131072, 16384, 128),
    (32, 8, 32768, 32768, 128), (32, 32, 16384, 131072, 128), (32, 32, 65536, 65536, 64),
    (16, 16, 65536, 65536, 256), (32, 32, 65536, 65536, 96)]


def timed_ms(fn, iterations=2):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


for heads, kv_heads, q_len, k_len, head_dim in [SHAPES[int(i)] for i in sys.argv[1:]] or SHAPES:
    generator = torch.Generator(device="cuda").manual_seed(q_len + k_len + head_dim)
    q, grad = (torch.randn(1, heads, q_len, head_dim, generator=generator, device="cuda",
                           dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, kv_heads, k_len, head_dim, generator=generator, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, enable_gqa=heads != kv_heads)
    chunk = query_chunk_rows(launches_for(CHUNKED, head_dim, head_dim)["dkdv_dq"], q_len,
                             heads // kv_heads, False, NO_VARIANTS, False)
    grads = {name: attention_backward(q, k, v, out, lse, grad, entry=entry)
             for name, entry in (("chunked", CHUNKED), ("one launch", ONE_LAUNCH))}
    errors = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
              for a, b in zip(grads["chunked"], grads["one launch"])]
    grads = None
    times = {"chunked": [], "one launch": []}
    for round_ in range(3):
        for name, entry in (("chunked", CHUNKED), ("one launch", ONE_LAUNCH))[::1 - 2 * (round_ % 2)]:
            times[name].append(timed_ms(lambda: attention_backward(q, k, v, out, lse, grad,
                                                                   entry=entry)))
    flops = 2.5 * 4 * heads * q_len * k_len * head_dim
    chunked, whole = (sorted(times[name])[1] for name in ("chunked", "one launch"))
    print(f"H={heads}/{kv_heads} q_len={q_len} k_len={k_len} D={head_dim} (chunks of {chunk} "
          f"query rows): chunked {chunked:.2f} ms ({flops / chunked / 1e9:.0f} TFLOPS; "
          f"{', '.join(f'{t:.2f}' for t in times['chunked'])}), one launch {whole:.2f} ms "
          f"({flops / whole / 1e9:.0f} TFLOPS; {', '.join(f'{t:.2f}' for t in times['one launch'])}), "
          f"chunked / one {chunked / whole:.3f}; dq/dk/dv differ by "
          f"{', '.join(f'{e:.1e}' for e in errors)}", flush=True)
    q = k = v = grad = out = lse = None  # before the next shape's tensors
    torch.cuda.empty_cache()
