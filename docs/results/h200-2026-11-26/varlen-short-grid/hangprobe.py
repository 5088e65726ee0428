"""Which launch of the packed backward hangs with dQ added atomically and a short grid."""
import dataclasses, faulthandler, json, sys, time
import torch
from cutile_fmha import attention_varlen
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps import backward as launcher

case = json.loads(sys.argv[1])
faulthandler.dump_traceback_later(25, exit=True)
if case.get("atomic", True):
    entry = backward_entry_for("sm_90")
    entry = dataclasses.replace(entry, launches={
        d: {"dkdv_dq": k["dkdv"]} | k for d, k in entry.launches.items()})
    launcher.backward_entry_for = lambda arch: entry
lengths = case["lengths"]
heads, kv_heads, D = case.get("heads", 8), case.get("kv_heads", 2), case.get("D", 64)
g = torch.Generator(device="cuda").manual_seed(7)
tq, tk = sum(p[0] for p in lengths), sum(p[1] for p in lengths)
r = lambda n, h: torch.randn(n, h, D, generator=g, device="cuda", dtype=torch.bfloat16)
q, k, v, go = r(tq, heads), r(tk, kv_heads), r(tk, kv_heads), r(tq, heads)
cu = lambda i: torch.tensor([0] + [p[i] for p in lengths], device="cuda").cumsum(0).to(torch.int32)
cu_q, cu_k = cu(0), cu(1)
inputs = [t.detach().requires_grad_() for t in (q, k, v)]
m = case["max"]
out = attention_varlen(*inputs, cu_q, cu_k, m, m, is_causal=case.get("causal", True))
torch.cuda.synchronize(); print("forward ok", flush=True)
out.backward(go)
torch.cuda.synchronize(); print("backward ok", [t.grad.isnan().sum().item() for t in inputs], flush=True)
