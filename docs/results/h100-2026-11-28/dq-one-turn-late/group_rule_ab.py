"""Which calls the one-kernel backward ("dkdv_dq") should run for at D=128, now that it adds
each pair's dQ one turn late: the table's rule (the two kernels under the causal mask with
more than two query heads to a K/V head) against "dkdv_dq" for every call, with cuDNN's
backward in the same rotating rounds (bf16, CUDA-graph replays of ours, cuDNN eager). First
the gradients of both on the same inputs, dq poisoned with NaN. Argument: rounds."""
import dataclasses
import statistics
import sys

import torch
import triton.testing

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import attention_backward

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
TABLE = backward_entry_for("sm_90")
EVERY_CALL = dataclasses.replace(TABLE, launches=TABLE.launches | {128: TABLE.launches[128] | {
    "dkdv_dq": dataclasses.replace(TABLE.launches[128]["dkdv_dq"], only_with=None)}})
ENTRIES = {"table": TABLE, "dkdv_dq": EVERY_CALL}
# (B, H, K/V heads, N, causal): grouped heads under the causal mask (the Llama demo's first),
# and for the record the plain shapes the table already runs "dkdv_dq" for.
SHAPES = [(4, 16, 4, 2048, True), (4, 32, 8, 2048, True), (4, 32, 8, 4096, True),
          (2, 32, 8, 8192, True), (1, 64, 8, 8192, True), (4, 32, 4, 4096, True),
          (4, 32, 32, 4096, True), (4, 32, 32, 4096, False), (4, 32, 32, 8192, True),
          (4, 32, 32, 8192, False), (4, 32, 32, 16384, True), (4, 32, 32, 16384, False)]


def inputs(b, h, hkv, n, causal, d=128):
    gen = torch.Generator(device="cuda").manual_seed(n + h + hkv)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=hkv != h)
    return q, k, v, out, lse, torch.randn_like(out)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    for b, h, hkv, n, causal in SHAPES:
        q, k, v, out, lse, do = inputs(b, h, hkv, n, causal)
        grads = {name: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry)
                 for name, entry in ENTRIES.items()}
        diffs = [((a.float() - o.float()).abs().max() / o.float().abs().max()).item()
                 for a, o in zip(grads["dkdv_dq"], grads["table"])]
        timers = {name: (lambda entry=entry: triton.testing.do_bench_cudagraph(
            lambda: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry),
            rep=100)) for name, entry in ENTRIES.items()}
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
        flops = 2.5 * 4 * b * h * n * n * 128 / (2 if causal else 1)
        print(f"B={b} H={h}/{hkv} N={n} causal={causal}: "
              + ", ".join(f"{name} {med[name]:.4f} ms ({flops / med[name] / 1e9:.0f} TFLOPS)"
                          for name in names)
              + f"; dkdv_dq / table {med['dkdv_dq'] / med['table']:.3f}"
              + f"; cudnn / table {med['cudnn'] / med['table']:.3f}"
              + f"; cudnn / dkdv_dq {med['cudnn'] / med['dkdv_dq']:.3f}"
              + f"; dq/dk/dv diff {diffs[0]:.1e}/{diffs[1]:.1e}/{diffs[2]:.1e}", flush=True)


main()
