"""Latency hints on the backward's loads (kernels/backward.py reads FMHA_BWD_LATENCY =
"q,do,k,v": dK/dV's Q and dO loads, dQ's K and V loads; 0 = the compiler's default):
the whole backward in CUDA graphs against cuDNN's (eager) in the same process, three
rotating rounds; prints one JSON line per shape with a hash of the gradients.
    python bwd_latency_ab.py compile|time"""
import hashlib, json, os, statistics, sys
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward
SHAPES = ((4, 16, 4, 2048, 128, True), (4, 32, 32, 4096, 128, True), (4, 32, 32, 8192, 128, True),
          (4, 32, 32, 8192, 128, False), (4, 32, 32, 8192, 64, True))
mode = sys.argv[1]
setting = os.environ.get("FMHA_BWD_LATENCY", "0,0,0,0")
for B, H, HKV, N, D, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    grads = attention_backward(q, k, v, out, lse, do, causal=causal)
    torch.cuda.synchronize()
    if mode == "compile":
        continue
    digest = hashlib.sha1(b"".join(t.contiguous().view(torch.uint8).cpu().numpy().tobytes() for t in grads)).hexdigest()[:12]
    fns = {"ours": lambda: attention_backward(q, k, v, out, lse, do, causal=causal)}
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HKV != H)
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    res = {n: [] for n in fns}
    for r in range(3):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=200))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(json.dumps({"setting": setting, "shape": f"B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}",
                      "ours_ms": med["ours"], "cudnn_ms": med["cudnn"], "ours_over_cudnn": med["ours"] / med["cudnn"],
                      "rounds": res, "grads": digest}), flush=True)
