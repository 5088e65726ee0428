"""Times the atomic-dQ probe (atomic_dq_probe.py) against the committed backward and cuDNN.
    python atomic_dq_run.py [compile]"""
import json, statistics, sys, time
import cuda.tile as ct
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward, row_dot
from cutile_fmha.steps.launcher import with_hints
import atomic_dq_probe as P

FAM = P.family()
KERNEL = with_hints(P.dkdv_atomic, {"num_worker_warps": 8})
CONFIGS = {64: [(128, 128, 0, 0)], 256: [(64, 64, 0, 0), (32, 64, 0, 0)]}
SHAPES = [(4, 32, 32, 4096, 64, True), (4, 32, 32, 4096, 64, False), (4, 32, 32, 16384, 64, True),
          (4, 16, 4, 2048, 64, True), (4, 16, 16, 4096, 256, True), (4, 16, 16, 8192, 256, True),
          (4, 16, 16, 8192, 256, False)]
compile_only = sys.argv[1:] == ["compile"]


def atomic_backward(q, k, v, out, lse, do, causal, tile_m, tile_n, orient, add):
    B, H, N, D = q.shape
    scale = D ** -0.5
    delta = row_dot(out, do)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    dq32 = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    values = {"Q": q, "K": k, "V": v, "dO": do, "Lse": lse, "Delta": delta, "dK": dk, "dV": dv,
              "dQacc": dq32, "qk_scale": scale, "query_offset": 0}
    values |= P.constants(D, tile_m, tile_n, causal, orient, add, group=H // k.shape[1])
    ct.launch(torch.cuda.current_stream(), FAM.grid(values), KERNEL, FAM.arguments(values))
    return (dq32 * scale).to(q.dtype), dk, dv


for B, H, HKV, N, D, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    base = attention_backward(q, k, v, out, lse, do, causal=causal)
    fns = {"ours": lambda: attention_backward(q, k, v, out, lse, do, causal=causal)}
    errors = {}
    for cfg in CONFIGS[D]:
        t0 = time.time()
        got = atomic_backward(q, k, v, out, lse, do, causal, *cfg)
        torch.cuda.synchronize()
        name = "atomic %dx%d o%d a%d" % cfg
        errors[name] = {"compile_s": round(time.time() - t0, 1)} | {
            g_: float((a.float() - b.float()).abs().max() / b.float().abs().max())
            for g_, a, b in zip(("dq", "dk", "dv"), got, base)}
        fns[name] = (lambda cfg=cfg: atomic_backward(q, k, v, out, lse, do, causal, *cfg))
    if compile_only:
        print(json.dumps({"shape": [B, H, N, D, causal], "errors": errors}), flush=True)
        continue
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HKV != H)
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    res = {n: [] for n in fns}
    for r in range(3):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=150))
    med = {n: statistics.median(t) for n, t in res.items()}
    flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
    print(json.dumps({"shape": f"B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}",
                      "ms": med, "over_ours": {n: med[n] / med["ours"] for n in med},
                      "tflops": {n: flops / med[n] / 1e9 for n in med},
                      "rounds": res, "errors": errors}), flush=True)
