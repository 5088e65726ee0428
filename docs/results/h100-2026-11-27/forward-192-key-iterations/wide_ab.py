"""Probe timing: key iterations of 192 keys (two products) against 128 (one), same code
otherwise, non-causal D=128 bf16, B=4 H=32, N multiple of 384; step 9's attention() and
SDPA cuDNN in the same rotating rounds (5) of CUDA-graph replays. Outputs against SDPA."""
import statistics, sys
import torch, triton
import cuda.tile as ct
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, "docs/results/h100-2026-11-27/forward-192-key-iterations")
import wide_keys
from cutile_fmha import attention
from cutile_fmha.steps.launcher import with_hints

print(torch.cuda.get_device_name(), flush=True)
torch.manual_seed(0)
B, H, D = 4, 32, 128
launches = {"128x128 (1 CTA, 8 warps)": (128, 128, {"occupancy": 1, "num_worker_warps": 8}),
            "128x192 pair (1 CTA, 8 warps)": (128, 192, {"occupancy": 1, "num_worker_warps": 8}),
            "64x128 (2 CTAs)": (64, 128, {"occupancy": 2, "num_worker_warps": None}),
            "64x192 pair (2 CTAs)": (64, 192, {"occupancy": 2, "num_worker_warps": None})}
for N in (4608, 8448, 16128):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * B * H * N * N * D
    fns = {}
    for name, (tm, tn, hints) in launches.items():
        kern = with_hints(wide_keys.fmha, hints)
        out = torch.empty_like(q)
        args = (q, k, v, out, 0, D ** -0.5, 0, D, tm, tn, 1, False, False)
        fns[name] = (lambda kern=kern, args=args, out=out, tm=tm: (
            ct.launch(torch.cuda.current_stream(), (N // tm, H, B), kern, args), out)[1])
    fns["step 9 attention()"] = lambda: attention(q, k, v)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    fns["SDPA cuDNN"] = cudnn
    ref = cudnn().float()
    errs = {}
    for name, f in fns.items():
        o = f()
        torch.cuda.synchronize()
        errs[name] = (o.float() - ref).abs().max().item()
    times = {k_: [] for k_ in fns}
    for _ in range(5):
        for name, f in fns.items():
            times[name].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k_: statistics.median(v_) for k_, v_ in times.items()}
    base = med["128x128 (1 CTA, 8 warps)"]
    print(f"N={N}: " + "; ".join(f"{k_} {v_:.3f} ms {flops / v_ / 1e9:.0f} TFLOPS x{v_ / base:.3f} "
                                 f"(err {errs[k_]:.1e})" for k_, v_ in med.items()), flush=True)
