"""The whole backward under whichever tileiras this process finds (run once per compiler):
the table's rule, the two kernels forced and "dkdv_dq" forced, against cuDNN; bf16, ours in
CUDA graphs, cuDNN eager, rotating rounds. One JSON line per shape and launch."""
import dataclasses
import json
import statistics

import sys

import cuda.tile._compile as compile_
import torch
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import KERNELS, backward_entry_for
from cutile_fmha.steps.backward import attention_backward

ROUNDS = 3
# (B, H, K/V heads, N, D_qk, D_v, causal)
SHAPES = [(4, 32, 32, 4096, 128, 128, True), (4, 32, 32, 4096, 128, 128, False),
          (4, 16, 4, 2048, 128, 128, True), (4, 32, 8, 4096, 128, 128, False),
          (4, 32, 32, 4096, 64, 64, True), (4, 32, 32, 4096, 64, 64, False),
          (4, 16, 16, 4096, 256, 256, True), (4, 16, 16, 4096, 256, 256, False),
          (2, 16, 16, 4096, 192, 128, True)]

table = backward_entry_for("sm_90")
two = dataclasses.replace(table, launches={
    d: {k: launch for k, launch in kernels.items() if k in KERNELS}
    for d, kernels in table.launches.items()}, exact_launches={})
one = dataclasses.replace(table, launches={
    d: kernels | {"dkdv_dq": dataclasses.replace(kernels["dkdv_dq"], only_with=None)}
    for d, kernels in table.launches.items()})
ENTRIES = {"table": table, "two kernels": two, "dkdv_dq": one}
version = compile_._get_compiler_version_string().split("release ")[1].split(",")[0]
print(torch.cuda.get_device_name(), "tileiras", version, flush=True)
# argv: the first shape to time (a run that stopped at one goes on from there)
for B, H, HKV, N, DQ, DV, causal in SHAPES[int(sys.argv[1]) if len(sys.argv) > 1 else 0:]:
    g = torch.Generator(device="cuda").manual_seed(N + H + DQ)
    q = torch.randn(B, H, N, DQ, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, HKV, N, DQ, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, HKV, N, DV, device="cuda", dtype=torch.bfloat16, generator=g)
    do = torch.randn(B, H, N, DV, device="cuda", dtype=torch.bfloat16, generator=g)
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=H != HKV)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                                             enable_gqa=H != HKV)
    fns = {name: (lambda e=e: attention_backward(q, k, v, out, lse, do, causal=causal, entry=e))
           for name, e in ENTRIES.items()}
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    ref = [t.float() for t in fns["cudnn"]()]
    errors = {name: [round(float((x.float() - y).abs().max() / y.abs().max()), 5)
                     for x, y in zip(fns[name](), ref)] for name in ENTRIES}
    times = {name: [] for name in fns}
    for r in range(ROUNDS):
        order = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
        for name in order:
            bench = tt.do_bench if name == "cudnn" else tt.do_bench_cudagraph
            times[name].append(bench(fns[name], rep=100))
    med = {name: statistics.median(t) for name, t in times.items()}
    row = {"tileiras": version, "shape": [B, H, HKV, N, DQ, DV, causal],
           "ms": {n: round(m, 4) for n, m in med.items()},
           "speed / cuDNN": {n: round(med["cudnn"] / m, 3) for n, m in med.items() if n != "cudnn"},
           "rounds": {n: [round(x, 4) for x in t] for n, t in times.items()},
           "rel. max error vs cuDNN dq dk dv": errors}
    print(json.dumps(row), flush=True)
