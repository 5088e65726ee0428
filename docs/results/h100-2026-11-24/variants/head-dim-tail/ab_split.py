"""The backward at D_qk/D_v 96/96 and 192/128 (B=4, H=32, bf16): ours (whichever package is
imported: the split column tiles or the padded ones) and cuDNN's in three rotating rounds."""
import json, os, statistics, sys, torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
import cutile_fmha
from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward
tag = sys.argv[1]
for qd, vd in ((96, 96), (192, 128)):
    for N in (4096, 8192):
        for causal in (True, False):
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k = (torch.randn(4, 32, N, qd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            v, do = (torch.randn(4, 32, N, vd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            out, lse = attention_with_lse(q, k, v, is_causal=causal)
            ours = lambda: attention_backward(q, k, v, out, lse, do, causal=causal)
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            cudnn = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
            res = {"ours": [], "cudnn": []}
            for r in range(3):
                for n in (("ours", "cudnn") if r % 2 == 0 else ("cudnn", "ours")):
                    res[n].append(tt.do_bench_cudagraph(ours, rep=200) if n == "ours" else tt.do_bench(cudnn, rep=200))
            med = {n: statistics.median(x) for n, x in res.items()}
            print(json.dumps({"package": tag, "dims": f"{qd}/{vd}", "N": N, "causal": causal, "ours_ms": round(med["ours"], 3),
                              "cudnn_ms": round(med["cudnn"], 3), "ours_over_cudnn": round(med["ours"] / med["cudnn"], 3)}), flush=True)
