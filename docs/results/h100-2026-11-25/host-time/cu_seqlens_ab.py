"""Host time per call without CUDA graphs, in one process: attention_varlen() before
(cutile_fmha_old, HEAD's files: the sequence bounds as four views of cu_seqlens, kept per
pair) and after (cu_seqlens passed as they are, CUMULATIVE_BOUNDS: two arrays fewer), with
SDPA and attention() as references; 15 rotating rounds of 1000 calls, medians. Outputs
compared bit for bit first."""
import statistics, time, torch, torch.nn.functional as F
import cutile_fmha as new
import cutile_fmha_old as old

def per_call_us(fn, n=1000):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    us = (time.perf_counter() - t) / n * 1e6; torch.cuda.synchronize(); return us

dev, dt = "cuda", torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for q_len in (1, 4, 128):
    g = torch.Generator(device=dev).manual_seed(q_len)
    q = torch.randn(1, 32, q_len, 128, device=dev, dtype=dt, generator=g)
    kc = torch.randn(1, 8, 512, 128, device=dev, dtype=dt, generator=g); vc = torch.randn_like(kc)
    qp, kp, vp = (t[0].transpose(0, 1).contiguous() for t in (q, kc, vc))
    cq = torch.tensor([0, q_len], dtype=torch.int32, device=dev)
    ck = torch.tensor([0, 512], dtype=torch.int32, device=dev)
    calls = {"sdpa": lambda: F.scaled_dot_product_attention(q, kc, vc, is_causal=q_len > 1, enable_gqa=True),
             "attention()": lambda: new.attention(q, kc, vc, enable_gqa=True)}
    for name, m in (("old", old), ("new", new)):
        calls[f"attention_varlen() {name}"] = lambda m=m: m.attention_varlen(qp, kp, vp, cq, ck, q_len, 512, is_causal=True)
        calls[f"varlen lse {name}"] = lambda m=m: m.attention_varlen(qp, kp, vp, cq, ck, q_len, 512, is_causal=True, return_lse=True)[0]
    outs = {k: f() for k, f in calls.items()}
    for k in calls:
        if k.endswith(" new"):
            assert torch.equal(outs[k], outs[k[:-3] + "old"]), k
    for f in calls.values():
        for _ in range(200): f()
    res = {k: [] for k in calls}
    names = list(calls)
    for r in range(15):
        for k in names[r % len(names):] + names[:r % len(names)]:
            res[k].append(per_call_us(calls[k]))
    print(f"q_len {q_len}, B=1, 32/8 heads, D=128, 512 keys, bf16; us per call, median of 15 rounds (min-max):")
    for k, v in res.items():
        print(f"  {k:28s} {statistics.median(v):6.1f}  ({min(v):.1f}-{max(v):.1f})", flush=True)
