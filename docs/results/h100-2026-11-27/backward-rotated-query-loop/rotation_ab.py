"""dK/dV CTAs without the mask, each starting its query loop at its own key tile's index
(the working tree) against the committed package (cutile_fmha_old): the whole backward,
bf16, rotating rounds in one process, ours in CUDA graphs, cuDNN eager. One JSON line a
shape: medians, new over old, speed over cuDNN's, gradients against the old package's."""
import json, statistics, sys
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
import cutile_fmha as new
from cutile_fmha.steps.backward import attention_backward as new_backward
from cutile_fmha_old.steps.backward import attention_backward as old_backward

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
DT = torch.bfloat16


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def bwd(B, H, HKV, N, D, causal):
    g = torch.Generator(device="cuda").manual_seed(N + H + HKV + D)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=DT, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=DT, generator=g) for _ in range(2))
    out, lse = new.attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal,
                                                             enable_gqa=HKV != H)
    fns = {"new": lambda: new_backward(q, k, v, out, lse, do, causal=causal),
           "old": lambda: old_backward(q, k, v, out, lse, do, causal=causal),
           "cudnn": lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)}
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    check = {n: [rel(a, b) for a, b in zip(grads[n], grads["cudnn"])] for n in grads}
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=100))
    med = {n: statistics.median(t) for n, t in res.items()}
    flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
    print(json.dumps({"shape": f"B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}",
                      "ms": med, "new_over_old": round(med["new"] / med["old"], 4),
                      "speed_over_cudnn": {n: round(med["cudnn"] / m, 3) for n, m in med.items()},
                      "tflops": {n: round(flops / m / 1e9, 1) for n, m in med.items()},
                      "rounds": res, "max_err_vs_cudnn": check}), flush=True)


print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
for shape in ((4, 32, 32, 4096, 64, False), (4, 32, 32, 8192, 64, False),
              (4, 32, 32, 16384, 64, False), (4, 32, 32, 4096, 128, False),
              (4, 32, 32, 8192, 128, False), (4, 32, 32, 16384, 128, False),
              (4, 32, 8, 8192, 128, False), (4, 16, 16, 8192, 256, False),
              (4, 32, 32, 8192, 128, True)):
    bwd(*shape)
