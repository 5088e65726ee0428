"""attention_varlen's no-gradient call path on CPU tensors, launch stubbed: us per call, then
its parts. Runs on the package before and after the positional launch (789e83d, 4df72df)."""
import timeit, statistics, torch, sys
from cutile_fmha import varlen as api
from cutile_fmha.steps import varlen as steps_varlen
from cutile_fmha.steps.family import FORWARD_VARLEN, packed
from cutile_fmha.steps.variants import NO_VARIANTS
steps_varlen.ct.launch = lambda *a: None
steps_varlen.current_stream = lambda d: 0
api._check = lambda q, *a, **k: (0.1, NO_VARIANTS)
fam = packed(FORWARD_VARLEN)
api.forward_plan = lambda *a, **k: steps_varlen.ForwardPlan(None, fam, (1, 1, 1), tuple(range(len(fam.names) - len(fam.tensor_names))), *([fam.tensors_from(steps_varlen.LAUNCH_ARRAYS)] if hasattr(steps_varlen, "LAUNCH_ARRAYS") else []))
q_len = int(sys.argv[1]) if len(sys.argv) > 1 else 1
q = torch.randn(q_len, 32, 128, dtype=torch.bfloat16); k = torch.randn(512, 8, 128, dtype=torch.bfloat16)
cq = torch.tensor([0, q_len], dtype=torch.int32); ck = torch.tensor([0, 512], dtype=torch.int32)
f = lambda: api.attention_varlen(q, k, k, cq, ck, q_len, 512, is_causal=True)
f()
res = [min(timeit.repeat(f, number=20000, repeat=3)) / 20000 * 1e6 for _ in range(5)]
print(f"attention_varlen python (q_len {q_len}): median {statistics.median(res):.2f} us, min {min(res):.2f}")
def parts():
    out = {}
    t = lambda fn: min(timeit.repeat(fn, number=20000, repeat=3)) / 20000 * 1e6
    args = (q, k, k, cq, ck, q_len, 512, True, None, False, (-1, -1), None, None)
    out["checked_once"] = t(lambda: api.checked_once(api._CHECKED, api._checked_call, args, tensors=5))
    out["needs_grad"] = t(lambda: api.needs_grad(q, k, k, None))
    out["SequenceBounds.packed"] = t(lambda: steps_varlen.SequenceBounds.packed(cq.contiguous(), ck.contiguous()))
    out["new_output"] = t(lambda: steps_varlen.new_output(q, 128))
    b = steps_varlen.SequenceBounds.packed(cq, ck)
    call = next(iter(api._CHECKED.values()))
    o = torch.empty_like(q)
    bounds = b.arrays() if hasattr(b, "arrays") else b  # after / before the positional launch
    out["plan.launch (stubbed)"] = t(lambda: call.plan.launch(q, k, k, o, 0, bounds, None))
    out["bounds.values"] = t(lambda: b.values())
    out["torch.empty_like"] = t(lambda: torch.empty_like(q))
    out["tensor_key x1"] = t(lambda: api.tensor_key(q) if hasattr(api, 'tensor_key') else None)
    out["t.device"] = t(lambda: q.device)
    for kk, v in out.items(): print(f"  {kk}: {v:.2f} us")
parts()
