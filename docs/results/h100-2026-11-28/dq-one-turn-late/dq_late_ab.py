"""The one-kernel backward ("dkdv_dq") with each pair's dQ added one turn late, after the
next pair's dK and dV products, against the package's, and cuDNN's backward, in one
process: bf16, rotating rounds of CUDA-graph replays (cuDNN eager). First the outputs of
both on the same inputs, dQ poisoned with NaN before each launch. The "dQ late" kernels are
the package's kernels/backward.py with dq-one-turn-late.diff applied in memory: the package
of commit 96a44ae, where the logged runs were made (since then the diff is the DQ_LATE
constant's code). Arguments: rounds, then which shapes ("128", "gqa", "256", "64"; default
all). The first run (dq-late-ab-first-run.log) had the grouped shape among D=128's and
stopped there: SDPA's cuDNN backend took grouped heads only with enable_gqa."""
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
    """The package's kernels/backward.py with every hunk of `diff_path` applied, written
    to a file (cuTile compiles a kernel from its source file) and imported as
    cutile_fmha.kernels.<name>, whose relative imports resolve in the package."""
    source = open(PACKAGE.__file__).read()
    for chunk in open(diff_path).read().split("\n@@")[1:]:
        hunk = chunk.split("\n", 1)[1].splitlines()
        old = "\n".join(line[1:] for line in hunk if line[:1] in " -")
        new = "\n".join(line[1:] for line in hunk if line[:1] in " +")
        if source.count(old) != 1:
            raise RuntimeError(f"{diff_path} does not apply to {PACKAGE.__file__}")
        source = source.replace(old, new)
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as file:
        file.write(source)
    spec = importlib.util.spec_from_file_location(f"cutile_fmha.kernels.{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DQ_LATE = patched_module("backward_dq_late", os.path.join(HERE, "dq-one-turn-late.diff"))
GROUPS = sys.argv[2:] or ["128", "gqa", "256", "64"]
CHECKS = {"128": [(2, 4, 4, 1000, 128, True), (2, 4, 2, 1000, 128, False),
                  (1, 4, 4, 777, 96, True), (1, 3, 3, 1, 128, False)],
          "256": [(1, 4, 4, 1000, 256, True)], "64": [(1, 4, 4, 777, 64, True)], "gqa": []}
SHAPES = {"128": [(4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False),
                  (2, 32, 32, 8192, 128, True), (2, 32, 32, 8192, 128, False)],
          "gqa": [(4, 32, 16, 4096, 128, True), (4, 32, 8, 4096, 128, False),
                  (4, 16, 4, 2048, 128, False)],
          "256": [(4, 16, 16, 8192, 256, True), (4, 16, 16, 8192, 256, False)],
          "64": [(4, 32, 32, 8192, 64, True), (4, 32, 32, 8192, 64, False)]}
CHECKS = [c for g in GROUPS for c in CHECKS[g]]
SHAPES = [s for g in GROUPS for s in SHAPES[g]]


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
    modules = {"package": PACKAGE, "dQ late": DQ_LATE}
    for b, h, hkv, n, d, causal in CHECKS + SHAPES:
        args = inputs(b, h, hkv, n, d, causal)
        try:
            old, new = (backward(*args, causal, m, poison=True) for m in modules.values())
        except Exception as error:  # noqa: BLE001 - the timings below still run
            print(f"check B={b} H={h}/{hkv} N={n} D={d} causal={causal}: {error!r}", flush=True)
            continue
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
            ref = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal,
                                                                 enable_gqa=hkv != h)
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
              + f"; late / package {med['dQ late'] / med['package']:.3f}"
              + f"; cudnn / late {med['cudnn'] / med['dQ late']:.3f}", flush=True)


main()
