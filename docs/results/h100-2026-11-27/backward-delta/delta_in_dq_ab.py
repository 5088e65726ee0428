"""The two-kernel backward with Delta written by the dQ kernel (DELTA_FROM_OUT, no row_dot
launch) against the same two kernels after row_dot, and cuDNN's backward, in one process:
bf16, D=128, rotating rounds of CUDA-graph replays (cuDNN eager). Shapes with four query
heads to a K/V head under the causal mask run the two kernels in the package; the others
are forced to them by deterministic algorithms (where "dkdv_dq" would run)."""
import statistics
import sys

import torch
import triton.testing

from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward, row_dot

SHAPES = [  # B, H, H_kv, N, causal, forced to two kernels
    (4, 16, 4, 2048, True, False),  # the Llama demo's
    (4, 32, 8, 4096, True, False),
    (8, 32, 8, 1024, True, False),
    (2, 32, 8, 8192, True, False),
    (4, 32, 32, 4096, True, True),
    (4, 32, 32, 4096, False, True),
    (4, 32, 8, 4096, False, True),
]
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def graphed(fn):
    return lambda: triton.testing.do_bench_cudagraph(fn, rep=100)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    for b, h, hkv, n, causal, forced in SHAPES:
        torch.use_deterministic_algorithms(forced, warn_only=True)
        gen = torch.Generator(device="cuda").manual_seed(n + h)
        q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(b, hkv, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=hkv != h)
        do = torch.randn_like(out)
        run = {
            "row_dot": lambda: attention_backward(q, k, v, out, lse, do, causal=causal,
                                                  delta=row_dot(out, do)),
            "in dQ": lambda: attention_backward(q, k, v, out, lse, do, causal=causal),
        }
        grads = {name: fn() for name, fn in run.items()}
        diffs = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                 for a, b in zip(grads["in dQ"], grads["row_dot"])]
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(
                *leaves, is_causal=causal, enable_gqa=hkv != h)
        times = {name: [] for name in list(run) + ["cudnn"]}
        timers = {name: graphed(fn) for name, fn in run.items()}
        timers["cudnn"] = lambda: triton.testing.do_bench(
            lambda: torch.autograd.grad(ref, leaves, do, retain_graph=True), rep=100)
        names = list(timers)
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(timers[name]())
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"B={b} H={h}/{hkv} N={n} causal={causal} deterministic={forced}: "
              + ", ".join(f"{name} {med[name]:.4f} ms ({min(times[name]):.4f}-"
                          f"{max(times[name]):.4f})" for name in names)
              + f"; in dQ / row_dot {med['in dQ'] / med['row_dot']:.3f}"
              + f"; cudnn / in dQ {med['cudnn'] / med['in dQ']:.3f}"
              + f"; dq/dk/dv max diff (relative) {diffs[0]:.1e}/{diffs[1]:.1e}/{diffs[2]:.1e}",
              flush=True)
    torch.use_deterministic_algorithms(False)


main()
