"""The backward at D=128 with the table's dK/dV (64x128) against 32x128 (query rows x keys),
8 worker warps, dQ at the table's; bf16, CUDA graphs, three rotating rounds; gradients compared."""
import statistics, torch, triton.testing as tt
from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.platforms.backward import backward_entry_for, with_launches, BackwardLaunch
from cutile_fmha.platforms.entry import TileShape
print(torch.cuda.get_device_name(), flush=True)
table = backward_entry_for("sm_90")
alt = with_launches(table, {(128, "dkdv"): BackwardLaunch(TileShape(32, 128), 8)}, "probe")
for B, H, N, causal in ((4, 32, 8192, False), (4, 32, 4096, True), (4, 32, 8192, True)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(B, H, N, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    out, lse = attention_with_lse(q, k, v, is_causal=causal)
    entries = {"table 64x128": table, "dkdv 32x128": alt}
    grads = {n: attention_backward(q, k, v, out, lse, do, causal=causal, entry=e) for n, e in entries.items()}
    same = all(torch.equal(a, b) for a, b in zip(*grads.values()))
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(*grads.values()))
    fns = {n: (lambda e=e: attention_backward(q, k, v, out, lse, do, causal=causal, entry=e)) for n, e in entries.items()}
    fns["cudnn"] = None
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    from torch.nn.attention import sdpa_kernel, SDPBackend
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(3):
        for n in names[r % 3:] + names[:r % 3]:
            bench = tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph
            res[n].append(bench(fns[n], rep=300))
    print(f"B={B} H={H} N={N} D=128 {'causal' if causal else 'non-causal'}: gradients identical {same} (max diff {diff:.3g}); ms: " +
          "; ".join(f"{n} {statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})" for n, v in res.items()), flush=True)
