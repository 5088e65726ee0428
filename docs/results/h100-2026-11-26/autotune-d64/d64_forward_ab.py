"""D=64 forward: the table's launches against the autotuner's of 2026-11-26 (causal: step 8
on 128x64 tiles, two CTAs per SM, eight worker warps; non-causal unchanged) and step 9 on
the same tiles, beside SDPA cuDNN: bf16 and fp16, B=4 H=32 at N 2048-16384 and B=16 H=32/8
at N=1024, causal (outputs against float64 up to N=2048, else against the table's), five rotating rounds of CUDA-graph replays (medians, ms)."""
import dataclasses, json, statistics, torch, triton.testing as tt
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.steps import attention
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import TileShape, TunedLaunch

table = entry_for("sm_90")
def with_causal(launch):
    return dataclasses.replace(table, tuned=table.tuned | {(64, True): launch})
ENTRIES = {"table": table,
           "step 8 128x64": with_causal(TunedLaunch(8, TileShape(128, 64), 2, 8)),
           "step 9 128x64": with_causal(TunedLaunch(9, TileShape(128, 64), 2, 8))}
print(json.dumps({"table_causal": str(table.tuned_launch(64, True)), "gpu": torch.cuda.get_device_name()}))
SHAPES = [(4, 32, 32, 2048), (4, 32, 32, 4096), (4, 32, 32, 8192), (4, 32, 32, 16384), (16, 32, 8, 1024)]
ROUNDS = 5
for dtype in (torch.bfloat16, torch.float16):
    for b, h, hkv, n in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n)
        q = torch.randn(b, h, n, 64, device="cuda", dtype=dtype, generator=g)
        k, v = (torch.randn(b, hkv, n, 64, device="cuda", dtype=dtype, generator=g) for _ in range(2))
        fns = {name: (lambda e=e: attention(q, k, v, causal=True, platform=e))
               for name, e in ENTRIES.items()}
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=hkv != h)
        fns["cudnn"] = cudnn
        # float64 reference where its N x N scores fit; else the table launch's output
        ref = (F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                              enable_gqa=hkv != h) if n <= 2048
               else fns["table"]().double())
        err = {name: (fn().double() - ref).abs().max().item() for name, fn in fns.items()}
        del ref
        times = {name: [] for name in fns}
        names = list(fns)
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(tt.do_bench_cudagraph(fns[name], rep=100))
        flops = 4 * b * h * n * n * 64 / 2
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(json.dumps({"dtype": str(dtype).split(".")[1], "B": b, "H": h, "Hkv": hkv, "N": n,
                              "method": name, "ms": med[name], "tflops": flops / med[name] / 1e9,
                              "over_table": med[name] / med["table"], "cudnn_over": med["cudnn"] / med[name],
                              "rounds": t, ("max_err_vs_float64" if n <= 2048 else "max_diff_vs_table"): err[name]}), flush=True)
