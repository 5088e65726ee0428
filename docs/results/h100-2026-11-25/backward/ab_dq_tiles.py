"""dQ on the table's 128x64 tiles (query rows x keys) against 128x32 and 256x32, 8 worker
warps, dK/dV at the table's; the whole backward, bf16, CUDA graphs (cuDNN eager), three
rotating rounds; gradients against the table's."""
import statistics, torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.platforms.backward import backward_entry_for, with_launches, BackwardLaunch
from cutile_fmha.platforms.entry import TileShape
print(torch.cuda.get_device_name(), flush=True)
table = backward_entry_for("sm_90")
def entry(tiles):
    return with_launches(table, {(d, "dq"): BackwardLaunch(TileShape(*tiles), 8) for d in (64, 128)}, "probe")
entries = {"dq 128x64": table, "dq 128x32": entry((128, 32)), "dq 256x32": entry((256, 32))}
for B, H, HKV, N, D, causal in ((4, 16, 4, 2048, 128, True), (4, 32, 32, 4096, 128, True), (4, 32, 32, 8192, 128, True),
                                (4, 32, 32, 8192, 128, False), (4, 32, 32, 8192, 64, True), (4, 32, 32, 8192, 64, False),
                                (2, 8, 8, 1000, 128, True)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    grads = {n: attention_backward(q, k, v, out, lse, do, causal=causal, entry=e) for n, e in entries.items()}
    ref = grads["dq 128x64"]
    diff = {n: max((a.float() - b.float()).abs().max().item() for a, b in zip(gr, ref)) for n, gr in grads.items()}
    fns = {n: (lambda e=e: attention_backward(q, k, v, out, lse, do, causal=causal, entry=e)) for n, e in entries.items()}
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HKV != H)
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(3):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=200))
    med = {n: statistics.median(v) for n, v in res.items()}
    print(f"B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}: largest gradient difference to the table's "
          + ", ".join(f"{n} {d:.3g}" for n, d in diff.items() if n != "dq 128x64") + "; ms: "
          + "; ".join(f"{n} {med[n]:.3f} ({min(v):.3f}-{max(v):.3f})" for n, v in res.items())
          + "; over the table's: " + ", ".join(f"{n} {med[n]/med['dq 128x64']:.3f}" for n in entries if n != "dq 128x64"), flush=True)
