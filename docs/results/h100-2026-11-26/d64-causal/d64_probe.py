"""D=64 causal forward at N=8192 and 16384 (B=4, H=32, bf16): the table's launch and three
others, against cuDNN, three rotating rounds of CUDA-graph replays; L2 grouping from
FMHA_L2_GROUP_MB (kernels/common.py, experiment)."""
import dataclasses, json, os, statistics, torch, triton.testing as tt
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.steps import attention
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import TileShape, TunedLaunch
LAUNCHES = {"table 128x128 occ2 w8": None, "128x64 occ2 w8": (128, 64, 2, 8),
            "128x128 occ1 w8": (128, 128, 1, 8), "64x128 occ2": (64, 128, 2, None)}
def entry(l):
    e = entry_for("sm_90")
    if l is None: return None
    m, n, o, w = l
    return dataclasses.replace(e, tuned=e.tuned | {(64, True): TunedLaunch(9, TileShape(m, n), o, w)})
group = os.environ.get("FMHA_L2_GROUP_MB", "16")
for N in (8192, 16384):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 32, N, 64, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    fns = {n: (lambda e=entry(l): attention(q, k, v, causal=True, platform=e)) for n, l in LAUNCHES.items()}
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    fns["cudnn"] = cudnn
    ref = fns["table 128x128 occ2 w8"]().float()
    err = {n: ((f().float() - ref).abs().max().item()) for n, f in fns.items()}
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(3):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append(tt.do_bench_cudagraph(fns[n], rep=200))
    flops = 4 * 4 * 32 * N * N * 64 / 2
    for n, t in res.items():
        m = statistics.median(t)
        print(json.dumps({"l2_group_mb": group, "N": N, "method": n, "ms": m, "tflops": flops / m / 1e9,
                          "rounds": t, "max_diff_vs_table": err[n]}), flush=True)
