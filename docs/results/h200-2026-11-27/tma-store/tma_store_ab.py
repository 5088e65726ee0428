"""Tile stores by TMA against element by element: the package against a copy of it with
tma-stores.diff applied (the output, dK, dV and dQ stored through `with_16_byte_rows`, the
head dim declared a multiple of 8), in one process on one GPU, bf16, CUDA-graph replays
(triton.testing.do_bench_cudagraph) in rotating rounds with SDPA's cuDNN forward. (The run
of tma-store-ab.log had the diff in the package and cccc6d0's kernel files in the copy: the
same two sets of kernels, "new" and "old".)

Last it reads cuTile's kernel cache (CUDA_TILE_CACHE_DIR, fresh for this run) for the
remark tileiras writes where it does not select a TMA store, per kernel: whether the
kernels the launcher compiles at run time (not the compile-only export) store by TMA.
Run: CUDA_TILE_CACHE_DIR=/tmp/ctcache python tma_store_ab.py [--out DIR]"""

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench_cudagraph

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, *[os.pardir] * 4))


def package_with_diff(name: str, diff: str):
    """The package's folders copied as `name`, `diff` applied, its custom operators renamed
    (they must not collide with the package's)."""
    dst = f"/tmp/tma-store-alt/{name}"
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(os.path.join(ROOT, "api"), dst)
    for sub in ("kernels", "steps", "platforms", "assets"):
        shutil.copytree(os.path.join(ROOT, sub), os.path.join(dst, sub))
    subprocess.run(["patch", "-p1", "-d", dst, "-i", os.path.join(HERE, diff)], check=True)
    for folder, _, files in os.walk(dst):
        for file in (f for f in files if f.endswith(".py")):
            path = os.path.join(folder, file)
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace('"cutile_fmha::', f'"{name}::'))
    sys.path.insert(0, os.path.dirname(dst))
    return importlib.import_module(name)


parser = argparse.ArgumentParser()
parser.add_argument("--out", default=".")
parser.add_argument("--rounds", type=int, default=5)
args = parser.parse_args()

import cutile_fmha as old  # noqa: E402
from cutile_fmha.steps.backward import attention_backward as old_backward  # noqa: E402
new = package_with_diff("cutile_fmha_tma", "tma-stores.diff")
from cutile_fmha_tma.steps.backward import attention_backward as new_backward  # noqa: E402

FORWARD = [  # (B, H, Hkv, N, D, causal)
    (4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False), (4, 32, 32, 16384, 128, True),
    (4, 16, 4, 2048, 128, True), (16, 32, 8, 1024, 128, True), (4, 32, 32, 4096, 64, True),
    (4, 32, 32, 4096, 64, False), (4, 16, 16, 4096, 256, True), (4, 16, 16, 4096, 256, False)]
BACKWARD = [(4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False),
            (4, 16, 4, 2048, 128, True), (4, 32, 32, 4096, 64, True),
            (4, 16, 16, 4096, 256, True)]


def inputs(b, h, hkv, n, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, heads, n, d, generator=g, device="cuda", dtype=torch.bfloat16)
            for heads in (h, hkv, hkv, h)]


def tflops(b, h, n, d, causal, ms, factor=1.0):
    return factor * 4 * b * h * n * n * d / (2 if causal else 1) / ms / 1e9


rows = []
for shape in FORWARD:
    b, h, hkv, n, d, causal = shape
    q, k, v, _ = inputs(b, h, hkv, n, d, seed=n + d)
    gqa = h != hkv
    outs = {"new": new.attention(q, k, v, is_causal=causal, enable_gqa=gqa),
            "old": old.attention(q, k, v, is_causal=causal, enable_gqa=gqa)}
    equal = torch.equal(outs["new"], outs["old"])
    methods = {"new": lambda: new.attention(q, k, v, is_causal=causal, enable_gqa=gqa),
               "old": lambda: old.attention(q, k, v, is_causal=causal, enable_gqa=gqa)}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
    methods["cudnn"] = cudnn
    times = {name: [] for name in methods}
    for r in range(args.rounds):
        names = list(methods)[r % 3:] + list(methods)[:r % 3]
        for name in names:
            times[name].append(do_bench_cudagraph(methods[name], rep=200))
    best = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    row = {"pass": "forward", "shape": shape, "equal": equal, "median_ms": best,
           "rounds_ms": times, "new_over_old": best["new"] / best["old"],
           "tflops": {name: tflops(b, h, n, d, causal, ms) for name, ms in best.items()}}
    rows.append(row)
    print(f"fwd {shape}: new {best['new']:.4f} old {best['old']:.4f} cudnn {best['cudnn']:.4f} ms, "
          f"new/old {row['new_over_old']:.4f}, outputs equal {equal}, rounds {times}", flush=True)

for shape in BACKWARD:
    b, h, hkv, n, d, causal = shape
    q, k, v, grad = inputs(b, h, hkv, n, d, seed=n + d + 1)
    out, lse = new.attention_with_lse(q, k, v, is_causal=causal, enable_gqa=h != hkv)
    grads = {"new": new_backward(q, k, v, out, lse, grad, causal=causal),
             "old": old_backward(q, k, v, out, lse, grad, causal=causal)}
    diffs = [((a.float() - o.float()).abs().max() / o.float().abs().max()).item()
             for a, o in zip(grads["new"], grads["old"])]
    methods = {"new": lambda: new_backward(q, k, v, out, lse, grad, causal=causal),
               "old": lambda: old_backward(q, k, v, out, lse, grad, causal=causal)}
    times = {name: [] for name in methods}
    for r in range(args.rounds):
        for name in (list(methods) if r % 2 == 0 else list(methods)[::-1]):
            times[name].append(do_bench_cudagraph(methods[name], rep=300))
    best = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    row = {"pass": "backward", "shape": shape, "dq_dk_dv_new_vs_old": diffs, "median_ms": best,
           "rounds_ms": times, "new_over_old": best["new"] / best["old"],
           "tflops": {name: tflops(b, h, n, d, causal, ms, 2.5) for name, ms in best.items()}}
    rows.append(row)
    print(f"bwd {shape}: new {best['new']:.4f} old {best['old']:.4f} ms, new/old "
          f"{row['new_over_old']:.4f}, dq/dk/dv largest difference {diffs}, rounds {times}",
          flush=True)

with open(os.path.join(args.out, "tma-store-ab.json"), "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)

# Which kernels the launchers compiled store by TMA: tileiras' remark where it does not.
cache_dir = os.environ.get("CUDA_TILE_CACHE_DIR")
if cache_dir:
    from cutile_cache._cache import cache_entries
    failed = passed = 0
    for entry in cache_entries(cache_dir):
        names = ",".join(entry.metadata.kernel_names)
        remarks = entry.metadata.remarks or ""
        n_failed = remarks.count("RemarkMemoryTmaStoreFailed")
        failed += n_failed > 0
        passed += n_failed == 0
        print(f"kernel {names[:90]}: TMA stores not selected {n_failed}", flush=True)
    print(f"kernels with a store not by TMA: {failed}; without: {passed}")
