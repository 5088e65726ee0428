"""The softcap's row max on the raw scores (the package: max-before-tanh.diff) against the
copy before it (step9_before.py: the max of the capped scores), and the plain forward
without a softcap, in one process: bf16, B=4, H=32 (16 at D=256), N=8192, softcap 30;
five rotating rounds of CUDA-graph replays, medians. Outputs first: both against float64
on scores spread over several units (inputs 3x standard normal), causal and not, with a
window, and odd lengths.

    git apply max-before-tanh.diff  # in the repository; then, in this folder:
    python softcap_ab.py > softcap-ab.log
"""
import json
import statistics
import sys
from pathlib import Path

import torch
import triton.testing as tt

sys.path.insert(0, str(Path(__file__).parent))
import step9_before  # noqa: E402
import cutile_fmha  # noqa: E402
from cutile_fmha.kernels import variants as variant_kernels  # noqa: E402
from cutile_fmha.platforms import entry_for  # noqa: E402
from cutile_fmha.steps.variants import Variants, variants_forward  # noqa: E402

ENTRY = entry_for("sm_90")
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)


def forward(kernel, q, k, v, causal, variants, out=None):
    """variants_forward with kernels/variants.py's kernel replaced by `kernel`."""
    package = variant_kernels.fmha
    variant_kernels.fmha = kernel
    try:
        result = variants_forward(q, k, v, query_offset=0 if causal else None,
                                  scale=q.shape[-1] ** -0.5, with_lse=True, variants=variants,
                                  platform=ENTRY)
    finally:
        variant_kernels.fmha = package
    return result


KERNELS = {"raw max": variant_kernels.fmha, "before": step9_before.variants_fmha}


def reference(q, k, v, causal, softcap, window):
    qd, kd, vd = (t.double() for t in (q, k, v))
    s = qd @ kd.transpose(-1, -2) * q.shape[-1] ** -0.5
    s = softcap * torch.tanh(s / softcap)
    n, m = s.shape[-2:]
    i, j = torch.arange(n)[:, None], torch.arange(m)[None, :]
    allowed = torch.ones(n, m, dtype=torch.bool)
    if causal:
        allowed &= j <= i
    if window is not None:
        allowed &= j >= i - window[0]
    s = s.masked_fill(~allowed.to(s.device), float("-inf"))
    return torch.softmax(s, -1) @ vd, torch.logsumexp(s, -1)


g = torch.Generator(device="cuda").manual_seed(0)
for d in (64, 128, 256):
    for causal, window, n in ((True, None, 1000), (False, None, 1000), (True, (256, 0), 1001)):
        q, k, v = (3 * torch.randn(1, 4, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        for softcap in (30.0, 5.0):
            ref, ref_lse = reference(q, k, v, causal, softcap, window)
            row = {"D": d, "causal": causal, "window": window, "N": n, "softcap": softcap}
            outs = {}
            for name, kernel in KERNELS.items():
                out, lse = forward(kernel, q, k, v, causal, Variants(softcap=softcap,
                                                                     window=window))
                outs[name] = out
                row[name] = {"max_err": (out.double() - ref).abs().max().item(),
                             "mean_err": (out.double() - ref).abs().mean().item(),
                             "lse_err": (lse.double() - ref_lse).abs().max().item(),
                             "nan": bool(out.isnan().any())}
            row["max_diff"] = (outs["raw max"] - outs["before"]).abs().max().item()
            print(json.dumps(row), flush=True)

for d, heads in ((128, 32), (64, 32), (256, 16)):
    for causal in (True, False):
        q, k, v = (torch.randn(4, heads, 8192, d, device="cuda", dtype=torch.bfloat16,
                               generator=g) for _ in range(3))
        capped = Variants(softcap=30.0)
        fns = {name: (lambda kernel=kernel: forward(kernel, q, k, v, causal, capped)[0])
               for name, kernel in KERNELS.items()}
        fns["plain"] = lambda: cutile_fmha.attention(q, k, v, is_causal=causal)
        diff = (fns["raw max"]() - fns["before"]()).abs().max().item()
        times = {name: [] for name in fns}
        names = list(fns)
        for r in range(5):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(tt.do_bench_cudagraph(fns[name], rep=100) * 1e3)
        med = {name: statistics.median(t) for name, t in times.items()}
        print(json.dumps({"D": d, "H": heads, "causal": causal, "us": med,
                          "raw_max_over_before": med["raw max"] / med["before"],
                          "raw_max_over_plain": med["raw max"] / med["plain"],
                          "before_over_plain": med["before"] / med["plain"],
                          "rounds_us": times, "max_diff": diff}), flush=True)
