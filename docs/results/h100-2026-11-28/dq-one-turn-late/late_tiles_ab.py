"""Other tiles for the one-kernel backward ("dkdv_dq") with its dQ one turn late: at D=64
64x128 (where the late dS^T fits the registers; the table's 128x128 spills it), and at
D=128 32x128 (dK/dV's tiles in the two-kernel backward), each against the table's launch,
with cuDNN's backward in the same rotating rounds (bf16, CUDA-graph replays of ours, cuDNN
eager). First the gradients against the table's on the same inputs. Argument: rounds."""
import dataclasses
import statistics
import sys

import torch
import triton.testing

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.platforms.entry import TileShape
from cutile_fmha.steps.backward import attention_backward

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
TABLE = backward_entry_for("sm_90")


def with_dkdv_dq(head_dim, **changes):
    launches = TABLE.launches[head_dim]
    return dataclasses.replace(TABLE, launches=TABLE.launches | {head_dim: launches | {
        "dkdv_dq": dataclasses.replace(launches["dkdv_dq"], **changes)}})


CANDIDATES = {
    64: {"64x128 late": with_dkdv_dq(64, tiles=TileShape(64, 128), dq_late=True),
         "64x128 on time": with_dkdv_dq(64, tiles=TileShape(64, 128), dq_late=False)},
    128: {"32x128 late": with_dkdv_dq(128, tiles=TileShape(32, 128))},
}
# (D, B, H, K/V heads, N, causal)
SHAPES = [(64, 4, 32, 32, 8192, True), (64, 4, 32, 32, 8192, False), (64, 4, 32, 8, 4096, True),
          (64, 4, 16, 4, 2048, True), (128, 4, 32, 32, 4096, True), (128, 4, 32, 32, 8192, False),
          (128, 4, 16, 4, 2048, True)]


def inputs(b, h, hkv, n, d, causal):
    gen = torch.Generator(device="cuda").manual_seed(n + h + hkv + d)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=hkv != h)
    return q, k, v, out, lse, torch.randn_like(out)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    for d, b, h, hkv, n, causal in SHAPES:
        q, k, v, out, lse, do = inputs(b, h, hkv, n, d, causal)
        entries = {"table": TABLE} | CANDIDATES[d]
        grads = {name: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry)
                 for name, entry in entries.items()}
        checks = {name: "/".join(
            f"{((a.float() - o.float()).abs().max() / o.float().abs().max()).item():.1e}"
            for a, o in zip(g, grads["table"])) for name, g in grads.items() if name != "table"}
        timers = {name: (lambda entry=entry: triton.testing.do_bench_cudagraph(
            lambda: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry),
            rep=100)) for name, entry in entries.items()}
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
        print(f"D={d} B={b} H={h}/{hkv} N={n} causal={causal}: "
              + ", ".join(f"{name} {med[name]:.4f} ms ({med[name] / med['table']:.3f})"
                          for name in names)
              + "; dq/dk/dv diff against the table's: "
              + ", ".join(f"{name} {c}" for name, c in checks.items()), flush=True)


main()
