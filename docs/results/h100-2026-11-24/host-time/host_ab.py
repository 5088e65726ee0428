"""Host time per call, no CUDA graph, in one process: attention_with_kvcache through the
committed decode launcher (old: a placeholder lookup per unused array; .scratch/decode_old.py
is `git show a28d14d:steps/decode.py`) and the new one (one lookup per stream), with SDPA,
attention() and attention_varlen(), 15 rotating rounds."""
import importlib.util, statistics, time, torch, torch.nn.functional as F
import cutile_fmha.kvcache as kv
from cutile_fmha import attention, attention_varlen, attention_with_kvcache
spec = importlib.util.spec_from_file_location("cutile_fmha.steps._decode_old", ".scratch/decode_old.py")
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
new_forward = kv.decode_forward
def per_call_us(fn, n=1000):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    us = (time.perf_counter() - t) / n * 1e6; torch.cuda.synchronize(); return us
dev, dt = "cuda", torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for q_len in (1, 4):
    q = torch.randn(1, 32, q_len, 128, device=dev, dtype=dt)
    kc = torch.randn(1, 8, 512, 128, device=dev, dtype=dt); vc = torch.randn_like(kc)
    lens = torch.full((1,), 512, dtype=torch.int32, device=dev)
    qp = q[0].transpose(0, 1).contiguous(); kp = kc[0].transpose(0, 1).contiguous(); vp = vc[0].transpose(0, 1).contiguous()
    cq = torch.tensor([0, q_len], dtype=torch.int32, device=dev); ck = torch.tensor([0, 512], dtype=torch.int32, device=dev)
    def kv_with(forward):
        def call():
            kv.decode_forward = forward
            return attention_with_kvcache(q, kc, vc, lens)
        return call
    calls = {"sdpa": lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True),
             "attention()": lambda: attention(q, kc, vc, enable_gqa=True),
             "attention_varlen()": lambda: attention_varlen(qp, kp, vp, cq, ck, q_len, 512, is_causal=True),
             "kvcache old": kv_with(old.decode_forward), "kvcache new": kv_with(new_forward)}
    outs = {k: calls[k]() for k in ("kvcache old", "kvcache new")}
    assert torch.equal(*outs.values()), "old and new differ"
    for f in calls.values():
        for _ in range(200): f()
    res = {k: [] for k in calls}
    names = list(calls)
    for r in range(15):
        for k in names[r % len(names):] + names[:r % len(names)]:
            res[k].append(per_call_us(calls[k]))
    print(f"q_len {q_len}, B=1, 32/8 heads, D=128, 512 keys, us per call (median of 15 rounds, min-max):", flush=True)
    for k, v in res.items():
        print(f"  {k:20s} {statistics.median(v):6.1f}  ({min(v):.1f}-{max(v):.1f})", flush=True)
kv.decode_forward = new_forward
