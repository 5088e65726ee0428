"""attention_with_kvcache at the committed package (cutile_fmha_old) and with the columns
on the M side (this tree), one process, rotating rounds of CUDA-graph replays; dense
caches at full length (one ragged row), bf16, causal at the last key; controls: a paged
cache and 32 columns (both unchanged)."""
import statistics, sys
import torch, triton
sys.path.insert(0, ".scratch/pk")
from cutile_fmha import attention_with_kvcache as new
from cutile_fmha_old import attention_with_kvcache as old
torch.manual_seed(0)
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)
ROUNDS = 5
cases = [  # batch, heads, kv_heads, new tokens, keys, D, ragged, paged block
    (1, 32, 8, 32, 32768, 128, False, None), (4, 32, 8, 32, 8192, 128, False, None),
    (16, 32, 8, 32, 4096, 128, False, None), (16, 32, 8, 32, 32768, 128, False, None),
    (64, 32, 8, 32, 4096, 128, False, None), (16, 64, 8, 16, 32768, 128, False, None),
    (16, 32, 8, 32, 32768, 128, True, None),
    (1, 32, 8, 16, 32768, 128, False, None), (4, 32, 8, 16, 8192, 128, False, None),
    (16, 32, 8, 16, 4096, 128, False, None), (16, 32, 8, 16, 32768, 128, False, None),
    (64, 32, 8, 16, 4096, 128, False, None), (16, 32, 8, 16, 32768, 128, True, None),
    (1, 32, 8, 32, 32768, 64, False, None), (16, 32, 8, 32, 32768, 64, False, None),
    (1, 32, 8, 16, 32768, 64, False, None), (16, 32, 8, 16, 32768, 64, False, None),
    (1, 32, 8, 32, 16384, 256, False, None), (16, 32, 8, 32, 16384, 256, False, None),
    (1, 32, 8, 16, 16384, 256, False, None), (16, 32, 8, 16, 16384, 256, False, None),
    (16, 32, 8, 32, 32768, 128, False, 64), (16, 32, 8, 8, 32768, 128, False, None),
]
for (B, Hq, Hkv, L, N, D, ragged, block) in cases:
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    if ragged:
        lengths = torch.randint(N // 8, N + 1, (B,), device="cuda", dtype=torch.int32)
    kw = {}
    if block:
        blocks = B * N // block
        kc = torch.randn(blocks, block, Hkv, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        kw["block_table"] = torch.randperm(blocks, device="cuda").int().reshape(B, N // block)
    else:
        kc = torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
    fns = {"old": lambda: old(q, kc, vc, lengths, **kw), "new": lambda: new(q, kc, vc, lengths, **kw)}
    diff = (fns["old"]().float() - fns["new"]().float()).abs().max().item()
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    nbytes = 2 * int(lengths.sum()) * Hkv * D * 2
    o, n = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"B={B} {Hq}/{Hkv} new={L} keys={N}{' ragged' if ragged else ''} D={D} "
          f"{'paged ' + str(block) if block else 'dense'} cols={Hq // Hkv * L}: old {o*1e3:.1f} us "
          f"({nbytes/(o*1e-3)/peak*100:.1f}%), new {n*1e3:.1f} us ({nbytes/(n*1e-3)/peak*100:.1f}%), "
          f"new/old {n/o:.3f} [rounds new/old {min(a/b for a, b in zip(times['new'], times['old'])):.3f}-"
          f"{max(a/b for a, b in zip(times['new'], times['old'])):.3f}], max |diff| {diff:.1e}", flush=True)
