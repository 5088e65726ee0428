"""Probe: decoding with 128 query columns per K/V head (GQA heads x new tokens) as the
decode kernel runs it (keys on M) against step 9's forward on the same bytes with the
columns as query rows (Q viewed (B, Hkv, G*L, D)), full-length dense caches, bf16, D=128."""
import torch, triton, statistics, sys
from cutile_fmha import attention, attention_with_kvcache
torch.manual_seed(0)
dev = "cuda"
def bench(f, rounds=3):
    return [triton.testing.do_bench_cudagraph(f, rep=100) for _ in range(rounds)]
rows = []
for (B, Hq, Hkv, L, N) in [(16, 32, 8, 32, 4096), (16, 32, 8, 32, 32768), (64, 32, 8, 32, 4096),
                           (4, 32, 8, 32, 8192), (16, 64, 8, 16, 32768), (16, 32, 8, 16, 32768),
                           (16, 32, 8, 8, 32768), (1, 32, 8, 32, 32768)]:
    D = 128
    G = Hq // Hkv
    q = torch.randn(B, Hq, L, D, device=dev, dtype=torch.bfloat16)
    kc = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    vc = torch.randn(B, Hkv, N, D, device=dev, dtype=torch.bfloat16)
    sl = torch.full((B,), N, device=dev, dtype=torch.int32)
    qr = q.view(B, Hkv, G * L, D)
    dec = lambda: attention_with_kvcache(q, kc, vc, sl)
    fwd = lambda: attention(qr, kc, vc)
    # correctness of the probe's reading: non-causal rows against the decode kernel non-causal
    o1 = attention_with_kvcache(q, kc, vc, sl, is_causal=False)
    o2 = fwd().view(B, Hq, L, D)
    err = (o1.float() - o2.float()).abs().max().item()
    t = {"decode": [], "step9 rows": []}
    for _ in range(3):
        t["decode"] += bench(dec, 1)
        t["step9 rows"] += bench(fwd, 1)
    nbytes = 2 * B * Hkv * N * D * 2
    peak = 3.35e12 if "H100" in torch.cuda.get_device_name() else 4.8e12
    line = f"B={B} {Hq}/{Hkv} L={L} N={N} cols={G*L} maxerr={err:.2e}"
    for k, v in t.items():
        ms = statistics.median(v)
        line += f" | {k} {ms*1e3:.1f} us {nbytes / (ms * 1e-3) / peak * 100:.1f}%"
    print(line, flush=True)
