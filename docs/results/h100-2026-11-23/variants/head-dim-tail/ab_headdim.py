"""A/B: the padded head dims' forward, ours against SDPA cuDNN (B=4, H=32, N=8192, bf16)."""
import sys, json, statistics, functools, torch
from cutile_fmha import attention
from cutile_fmha.assets import measure
label = sys.argv[1]
for q_dim, v_dim, causal in ((96, 96, False), (96, 96, True), (192, 128, False), (192, 128, True), (80, 80, False)):
    q, k = measure.make_inputs(measure.Shape(4, 32, 8192, 8192, q_dim, causal, "bfloat16"))[:2]
    v = torch.randn(*k.shape[:-1], v_dim, device="cuda", dtype=k.dtype)
    calls = {"ours": lambda: attention(q, k, v, is_causal=causal),
             "cudnn": functools.partial(measure.sdpa, q, k, v, causal=causal, backend="cudnn")}
    names = list(calls)
    try:
        calls["cudnn"](); torch.cuda.synchronize()
    except RuntimeError as e:
        names = ["ours"]
    with torch.no_grad():
        t = measure.time_in_rounds(names, 3, lambda n: measure.time_ms(calls[n]))
    res = {n: statistics.median(x) for n, x in zip(names, t)}
    print(json.dumps({"label": label, "D": f"{q_dim}/{v_dim}", "causal": causal, **{k: round(v, 4) for k, v in res.items()},
                      "cudnn/ours": round(res["cudnn"] / res["ours"], 3) if "cudnn" in res else None}), flush=True)
