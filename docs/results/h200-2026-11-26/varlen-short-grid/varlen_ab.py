"""The variable-length forward, one tile per CTA (new) against the strided loop (old): time
and outputs, packed batches of 16 x 4096 (bf16), in rotating rounds of CUDA-graph replays."""
import json, sys
import torch
from triton.testing import do_bench_cudagraph
sys.path.insert(0, "oldpkg")
from cutile_fmha import attention_varlen as new
from cutile_fmha_old import attention_varlen as old

print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
for D, heads, kv in [(64, 32, 8), (128, 32, 8), (256, 16, 4)]:
    for causal in (True, False):
        n, seqs = 4096, 16
        g = torch.Generator(device="cuda").manual_seed(D)
        q = torch.randn(n * seqs, heads, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(n * seqs, kv, D, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn_like(k)
        cu = torch.arange(0, seqs + 1, device="cuda", dtype=torch.int32) * n
        fns = {name: (lambda f=f: f(q, k, v, cu, cu, n, n, is_causal=causal))
               for name, f in (("old", old), ("new", new))}
        outs = {name: fn() for name, fn in fns.items()}
        same = torch.equal(outs["old"], outs["new"])
        rounds = {name: [] for name in fns}
        for r in range(3):
            order = list(fns)[r % 2:] + list(fns)[:r % 2]
            for name in order:
                rounds[name].append(do_bench_cudagraph(fns[name], rep=200))
        flops = 4 * seqs * heads * n * n * D / (2 if causal else 1)
        med = {k_: sorted(v_)[1] for k_, v_ in rounds.items()}
        print(json.dumps({"D": D, "heads": f"{heads}/{kv}", "causal": causal, "equal": same,
                          "ms": med, "new_over_old": med["new"] / med["old"],
                          "tflops": {k_: flops / v_ / 1e9 for k_, v_ in med.items()},
                          "rounds": rounds}), flush=True)
