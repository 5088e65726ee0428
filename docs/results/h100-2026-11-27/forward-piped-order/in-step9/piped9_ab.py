"""Step 9 without the mask against the same kernel with its unmasked loop in FA3's order
(piped9.py), bf16, B=4 H=32 D=128, rotating rounds of CUDA-graph replays beside step 9's
attention() and SDPA cuDNN. Outputs poisoned with NaN before, checked against cuDNN."""
import statistics, sys
import torch, triton
import cuda.tile as ct
from torch.nn.attention import SDPBackend, sdpa_kernel
sys.path.insert(0, ".scratch/piped9")
import piped9
from cutile_fmha import attention
from cutile_fmha.steps.launcher import with_hints

print(torch.cuda.get_device_name(), flush=True)
torch.manual_seed(0)
B, H, D = 4, 32, 128
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
launches = {"64x128 occ2": (64, 128, {"occupancy": 2, "num_worker_warps": None}),
            "128x128 occ1": (128, 128, {"occupancy": 1, "num_worker_warps": 8})}
for N in (4096, 8192, 16384, 8000):
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    flops = 4 * B * H * N * N * D
    fns = {}
    for lname, (tm, tn, hints) in launches.items():
        kern = with_hints(piped9.fmha, hints)
        for piped in (False, True):
            out = torch.full_like(q, float("nan"))
            args = (q, k, v, out, out, D ** -0.5, 0, D, tm, tn, 1, False, False, piped)
            fns[f"{'piped' if piped else 'step9 loop'} {lname}"] = (
                lambda kern=kern, args=args, out=out, tm=tm: (
                    ct.launch(torch.cuda.current_stream(), (triton.cdiv(N, tm), H, B), kern,
                              args), out)[1])
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
    for r in range(ROUNDS):
        names = list(fns)
        names = names[r % len(names):] + names[:r % len(names)]
        for name in names:
            times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=100))
    med = {k_: statistics.median(v_) for k_, v_ in times.items()}
    base = med["step 9 attention()"]
    print(f"D={D} N={N}:", flush=True)
    for k_, v_ in med.items():
        print(f"  {k_:24s} {v_:8.3f} ms {flops / v_ / 1e9:5.0f} TFLOPS x{v_ / base:.3f} "
              f"(range {min(times[k_]):.3f}-{max(times[k_]):.3f}, err {errs[k_]:.1e})", flush=True)
