"""A/B of the CTA order: forward and backward of ours and SDPA cuDNN, causal, per shape."""
import sys, json, statistics, torch
from cutile_fmha import attention
from cutile_fmha.assets import measure
from cutile_fmha.assets.fmha_backward_benchmark import time_backward_ms
label = sys.argv[1]
shapes = [(4, 16, 4, 2048, 128), (4, 32, 32, 2048, 128), (4, 32, 32, 4096, 128), (4, 32, 32, 8192, 128),
          (4, 32, 32, 4096, 64), (4, 16, 16, 4096, 256), (2, 32, 8, 1024, 128)]
for b, h, kvh, n, d in shapes:
    shape = measure.Shape(b, h, n, n, d, True, "bfloat16", kv_heads=kvh)
    q, k, v = [t.requires_grad_() for t in measure.make_inputs(shape)]
    grad = torch.randn_like(q)
    calls = {"ours": lambda: attention(q, k, v, is_causal=True, enable_gqa=True),
             "cudnn": lambda: measure.sdpa(q, k, v, causal=True, backend="cudnn")}
    res = {}
    for pas in ("fwd", "bwd"):
        names = list(calls)
        def one(name):
            if pas == "fwd":
                with torch.no_grad():
                    return measure.time_ms(calls[name])
            return time_backward_ms(calls[name], [q, k, v], grad)
        t = measure.time_in_rounds(names, 3, one)
        for name, ts in zip(names, t):
            res[f"{pas} {name}"] = statistics.median(ts)
    row = {"label": label, "shape": f"B{b} H{h}/{kvh} N{n} D{d}", **{k: round(v, 4) for k, v in res.items()},
           "fwd ours/cudnn time": round(res["fwd ours"] / res["fwd cudnn"], 3),
           "bwd ours/cudnn time": round(res["bwd ours"] / res["bwd cudnn"], 3)}
    print(json.dumps(row), flush=True)
