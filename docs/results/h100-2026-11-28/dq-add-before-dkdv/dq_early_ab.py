"""The one-kernel backward ("dkdv_dq") with each turn's dQ added before its dK and dV
products against the package's order, and cuDNN's backward, in one process: bf16, rotating
rounds of CUDA-graph replays (cuDNN eager). First the outputs of both on the same inputs, dQ
poisoned with NaN before each launch. The "dQ first" kernels are the package's
kernels/backward.py with dq-add-before-dkdv.diff applied in memory. (The logged run had
that diff applied to the working tree and the package's file of the commit before beside
it: the same two sources.)"""
import importlib.util
import math
import os
import statistics
import sys
import tempfile

import torch
import triton.testing

from cutile_fmha import attention_with_lse
from cutile_fmha.kernels import backward as PACKAGE
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, launch_gradient_kernels

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
HERE = os.path.dirname(os.path.abspath(__file__))


def patched_module(name: str, diff_path: str):
    """The package's kernels/backward.py with the one hunk of `diff_path` applied, written
    to a file (cuTile compiles a kernel from its source file) and imported as
    cutile_fmha.kernels.<name>, whose relative imports resolve in the package."""
    hunk = open(diff_path).read().split("\n@@")[1].split("\n", 1)[1].splitlines()
    old = "\n".join(line[1:] for line in hunk if line[:1] in " -")
    new = "\n".join(line[1:] for line in hunk if line[:1] in " +")
    source = open(PACKAGE.__file__).read()
    if source.count(old) != 1:
        raise RuntimeError(f"{diff_path} does not apply to {PACKAGE.__file__}")
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as file:
        file.write(source.replace(old, new))
    spec = importlib.util.spec_from_file_location(f"cutile_fmha.kernels.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DQ_FIRST = patched_module("backward_dq_first", os.path.join(HERE, "dq-add-before-dkdv.diff"))
CHECKS = [(2, 4, 4, 1000, 128, True), (2, 4, 2, 1000, 128, False), (1, 4, 4, 777, 64, True)]
SHAPES = [(4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False),
          (2, 32, 32, 8192, 128, True), (4, 32, 32, 8192, 64, True)]


def backward(q, k, v, out, lse, do, causal, module, poison=False):
    dq = torch.full_like(q, math.nan) if poison else torch.empty_like(q)
    tensors = {"Q": q, "K": k, "V": v, "dO": do, "Lse": lse, "Out": out, "Delta": None,
               "dK": torch.empty_like(k), "dV": torch.empty_like(v), "dQ": dq,
               "qk_scale": q.shape[-1] ** -0.5, "query_offset": 0}
    launch_gradient_kernels(BACKWARD_FAMILIES, tensors, causal=causal, module=module)
    return dq, tensors["dK"], tensors["dV"]


def inputs(b, h, hkv, n, d, causal):
    gen = torch.Generator(device="cuda").manual_seed(n + h + d)
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, generator=gen)
            for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=hkv != h)
    return q, k, v, out, lse, torch.randn_like(out)


def main():
    print(torch.cuda.get_device_name(), flush=True)
    modules = {"before": PACKAGE, "dQ first": DQ_FIRST}
    for b, h, hkv, n, d, causal in CHECKS + SHAPES:
        args = inputs(b, h, hkv, n, d, causal)
        old, new = (backward(*args, causal, m, poison=True) for m in modules.values())
        diffs = [((a.float() - o.float()).abs().max() / o.float().abs().max()).item()
                 for a, o in zip(new, old)]
        print(f"check B={b} H={h}/{hkv} N={n} D={d} causal={causal}: dq/dk/dv relative max diff "
              f"{diffs[0]:.1e}/{diffs[1]:.1e}/{diffs[2]:.1e}, NaN {[int(t.isnan().sum()) for t in new]}",
              flush=True)
    for b, h, hkv, n, d, causal in SHAPES:
        q, k, v, out, lse, do = inputs(b, h, hkv, n, d, causal)
        timers = {name: (lambda m=m: triton.testing.do_bench_cudagraph(
            lambda: backward(q, k, v, out, lse, do, causal, m), rep=100))
            for name, m in modules.items()}
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            ref = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        timers["cudnn"] = lambda: triton.testing.do_bench(
            lambda: torch.autograd.grad(ref, leaves, do, retain_graph=True), rep=100)
        names, times = list(timers), {name: [] for name in timers}
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(timers[name]())
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"B={b} H={h} N={n} D={d} causal={causal}: "
              + ", ".join(f"{name} {med[name]:.4f} ms ({min(times[name]):.4f}-"
                          f"{max(times[name]):.4f})" for name in names)
              + f"; new / old {med['dQ first'] / med['before']:.3f}"
              + f"; cudnn / new {med['cudnn'] / med['dQ first']:.3f}", flush=True)


main()
