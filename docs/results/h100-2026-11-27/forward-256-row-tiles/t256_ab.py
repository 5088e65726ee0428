"""Step 9 on 256-row tiles (256x64, one CTA per SM, eight worker warps: two consumer
warpgroups of 128 rows each) against the table's launches and SDPA cuDNN, bf16, B=4,
H=32, D=64 and 128, causal and not; five rotating rounds of CUDA-graph replays (medians,
ms); outputs against the table launch's (and float64 at N=1024)."""
import dataclasses, json, statistics, torch, triton.testing as tt
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.steps import attention
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import TileShape, TunedLaunch

table = entry_for("sm_90")
def with_launch(d, causal, launch):
    return dataclasses.replace(table, tuned=table.tuned | {(d, causal): launch})
print(json.dumps({"gpu": torch.cuda.get_device_name(),
                  "table": {f"{d}-{c}": str(table.tuned_launch(d, c)) for d in (64, 128) for c in (True, False)}}))
ROUNDS = 5
for d, ns in ((64, (1024, 4096, 8192, 16384)), (128, (4096, 16384))):
    for causal in (True, False):
        entries = {"table": table,
                   "256x64 occ1 w8": with_launch(d, causal, TunedLaunch(9, TileShape(256, 64), 1, 8))}
        for n in ns:
            g = torch.Generator(device="cuda").manual_seed(n + d)
            q, k, v = (torch.randn(4, 32, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(3))
            fns = {name: (lambda e=e: attention(q, k, v, causal=causal, platform=e))
                   for name, e in entries.items()}
            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            fns["cudnn"] = cudnn
            ref = (F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
                   if n <= 1024 else fns["table"]().double())
            err = {name: (fn().double() - ref).abs().max().item() for name, fn in fns.items()}
            del ref
            times = {name: [] for name in fns}
            names = list(fns)
            for r in range(ROUNDS):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    times[name].append(tt.do_bench_cudagraph(fns[name], rep=100))
            flops = 4 * 4 * 32 * n * n * d / (2 if causal else 1)
            med = {name: statistics.median(t) for name, t in times.items()}
            for name, t in times.items():
                print(json.dumps({"D": d, "causal": causal, "N": n, "method": name, "ms": med[name],
                                  "tflops": flops / med[name] / 1e9, "over_table": med[name] / med["table"],
                                  "rounds": t, ("max_err_vs_float64" if n <= 1024 else "max_diff_vs_table"): err[name]}),
                      flush=True)
