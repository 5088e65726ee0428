"""attention_varlen's planned path on the packed tensors (new) against the same plan on
host views (old: four as_strided per call), interleaved in one process, with SDPA."""
import time, statistics, torch
from cutile_fmha import attention, attention_varlen
from cutile_fmha import varlen as av
from cutile_fmha.steps.launcher import unused_lse
def per_call_us(fn, n=1000):
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us
dev, dt = "cuda", torch.bfloat16
kp = torch.randn(512, 8, 128, device=dev, dtype=dt); vp = torch.randn_like(kp)
ck = torch.tensor([0, 512], dtype=torch.int32, device=dev)
q4 = torch.randn(1, 32, 1, 128, device=dev, dtype=dt)
kc = torch.randn(1, 8, 512, 128, device=dev, dtype=dt); vc = torch.randn_like(kc)
for q_len in (1, 128):
    qp = torch.randn(q_len, 32, 128, device=dev, dtype=dt)
    cq = torch.tensor([0, q_len], dtype=torch.int32, device=dev)
    new = lambda: attention_varlen(qp, kp, vp, cq, ck, q_len, 512, is_causal=True)
    new()
    new_planned = av._launch_planned
    def old_planned(call, query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, is_causal, return_lse, sinks):
        bounds = av.packed_bounds(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous())
        out = av.new_output(query, value.shape[-1])
        views = getattr(call, "views", None)
        if views is None:
            views = call.views = tuple((r.shape, r.stride()) for r in (av._one_batch_row(t) for t in (query, key, value, out)))
        q, k, v, o = (t.as_strided(*vw) for t, vw in zip((query, key, value, out), views))
        call.plan.launch(q, k, v, o, unused_lse(query.device), bounds, sinks)
        return out
    def old():
        av._launch_planned = old_planned
        try:
            return new()
        finally:
            av._launch_planned = new_planned
    def new_swapped():
        av._launch_planned = new_planned
        try:
            return new()
        finally:
            av._launch_planned = new_planned
    assert torch.equal(old(), new())
    calls = {"sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True),
             "attention": lambda: attention(q4, kc, vc, enable_gqa=True), "varlen old (host views)": old,
             "varlen new (packed tensors)": new_swapped}
    for f in calls.values():
        for _ in range(100): f()
    res = {k: [] for k in calls}
    for r in range(15):
        for k in (list(calls)[r % 4:] + list(calls)[:r % 4]):
            res[k].append(per_call_us(calls[k]))
    print(f"q_len {q_len}: " + "  ".join(f"{k} {statistics.median(v):.1f} (min {min(v):.1f})" for k, v in res.items()), flush=True)
