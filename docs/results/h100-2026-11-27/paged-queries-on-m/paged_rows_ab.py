"""Paged caches with the columns on the M side (this tree) against the committed package
(cutile_fmha_old, transposed products), and against this tree's dense cache on the same
keys: rotating rounds of CUDA-graph replays, bf16, causal at the last key. (The GPU tests
check the outputs against float64, with NaN in every block row outside a sequence.)
Run as `python paged_rows_ab.py` with the committed package copied to
.scratch/pk/cutile_fmha_old."""
import math, statistics, sys
import torch, triton
sys.path.insert(0, ".scratch/pk")
from cutile_fmha import attention_with_kvcache as new
from cutile_fmha_old import attention_with_kvcache as old
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)


def paged(B, Hkv, N, D, block, ends, dense_too=False, nan=True):
    per = math.ceil(N / block)
    blocks = B * per + 3
    kc = torch.randn(blocks, block, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(blocks, device="cuda")[:B * per].int().reshape(B, per)
    if nan:
        unused = torch.ones(blocks, block, dtype=torch.bool, device="cuda")
        for b, e in enumerate(ends):
            for i in range(math.ceil(e / block)):
                unused[table[b, i], :min(block, e - i * block)] = False
        kc[unused] = math.nan
        vc[unused] = math.nan
    dense = None
    if dense_too:
        dense = [c[table.long()].flatten(1, 2).transpose(1, 2).contiguous() for c in (kc, vc)]
    return kc, vc, table, dense


ROUNDS = 5
cases = [  # batch, heads, kv_heads, new tokens, keys, D, block
    (1, 32, 8, 32, 32768, 128, 64), (16, 32, 8, 32, 4096, 128, 64), (16, 32, 8, 32, 32768, 128, 64),
    (64, 32, 8, 32, 4096, 128, 64),
    (1, 32, 8, 32, 32768, 128, 256), (16, 32, 8, 32, 32768, 128, 256), (64, 32, 8, 32, 4096, 128, 256),
    (1, 32, 8, 16, 32768, 128, 64), (16, 32, 8, 16, 4096, 128, 64), (16, 32, 8, 16, 32768, 128, 64),
    (64, 32, 8, 16, 4096, 128, 64),
    (16, 32, 8, 16, 32768, 128, 256), (16, 32, 8, 16, 32768, 128, 128),
    (16, 32, 8, 32, 32768, 64, 64), (16, 32, 8, 16, 32768, 64, 256),
    (16, 32, 8, 32, 16384, 256, 64), (16, 32, 8, 16, 16384, 256, 256),
    (16, 32, 8, 16, 32768, 128, 32), (16, 32, 8, 1, 32768, 128, 64),  # controls: unchanged
]


def bench():
    for (B, Hq, Hkv, L, N, D, block) in cases:
        q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
        lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
        kc, vc, table, dense = paged(B, Hkv, N, D, block, [N] * B, dense_too=True, nan=False)
        fns = {"old": lambda: old(q, kc, vc, lengths, block_table=table),
               "new": lambda: new(q, kc, vc, lengths, block_table=table),
               "dense": lambda: new(q, *dense, lengths)}
        diff = (fns["old"]().float() - fns["new"]().float()).abs().max().item()
        diff_dense = (fns["dense"]().float() - fns["new"]().float()).abs().max().item()
        times = {k: [] for k in fns}
        for _ in range(ROUNDS):
            for k, f in fns.items():
                times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
        nbytes = 2 * B * N * Hkv * D * 2
        o, n, d = (statistics.median(times[k]) for k in ("old", "new", "dense"))
        r = [a / b for a, b in zip(times["new"], times["old"])]
        rd = [a / b for a, b in zip(times["new"], times["dense"])]
        print(f"B={B} {Hq}/{Hkv} new={L} keys={N} D={D} block={block}: old {o*1e3:.1f} us "
              f"({nbytes/(o*1e-3)/peak*100:.1f}%), new {n*1e3:.1f} us ({nbytes/(n*1e-3)/peak*100:.1f}%), "
              f"dense {d*1e3:.1f} us ({nbytes/(d*1e-3)/peak*100:.1f}%); new/old {n/o:.3f} "
              f"[{min(r):.3f}-{max(r):.3f}], paged/dense {n/d:.3f} [{min(rd):.3f}-{max(rd):.3f}]; "
              f"max |new-old| {diff:.1e}, |new-dense| {diff_dense:.1e}", flush=True)
        del kc, vc, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    torch.manual_seed(0)
    bench()
