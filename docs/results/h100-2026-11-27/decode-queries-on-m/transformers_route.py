"""How the transformers backend would run a step of 17-32 new tokens: the dense kernel
(bottom-right causal, its route above DECODE_MAX_QUERY) against the decode kernel
(attention_with_kvcache), bf16, D=128, full caches, CUDA graphs, 5 rotating rounds."""
import statistics, torch, triton
from cutile_fmha.dropin import run_attention
from cutile_fmha import attention_with_kvcache
print(torch.cuda.get_device_name(), flush=True)
for (B, Hq, Hkv, L, N) in [(1, 32, 8, 24, 4096), (1, 32, 8, 32, 32768), (8, 32, 8, 32, 4096),
                           (8, 32, 8, 20, 8192), (16, 32, 8, 32, 32768), (4, 16, 4, 32, 2048)]:
    q = torch.randn(B, Hq, L, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, Hkv, N, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    dense = lambda: run_attention(q, k, v, "bottom_right", 128 ** -0.5, False)[0]
    decode = lambda: attention_with_kvcache(q, k, v, is_causal=True)
    diff = (dense().float() - decode().float()).abs().max().item()
    t = {"dense": [], "decode": []}
    for _ in range(5):
        t["dense"].append(triton.testing.do_bench_cudagraph(dense, rep=100))
        t["decode"].append(triton.testing.do_bench_cudagraph(decode, rep=100))
    d, c = statistics.median(t["dense"]), statistics.median(t["decode"])
    print(f"B={B} {Hq}/{Hkv} new={L} keys={N}: dense kernel {d*1e3:.1f} us, decode kernel "
          f"{c*1e3:.1f} us, decode/dense {c/d:.3f}, max |diff| {diff:.1e}", flush=True)
