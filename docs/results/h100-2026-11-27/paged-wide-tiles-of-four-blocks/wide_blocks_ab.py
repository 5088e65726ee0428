"""Paged caches in blocks of 16 on the wide launch (128+ columns, M side): tiles of tile_n
(8 blocks) against tiles of at most 4 blocks (DecodeLaunch.rows_wide_blocks=4), and the dense
cache on the same keys; one process, 5 rotating rounds of CUDA-graph replays, bf16, causal at
the last key, full lengths; outputs compared."""
import dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
from cutile_fmha import attention_with_kvcache
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)
torch.manual_seed(0)
ROUNDS = 5
# (batch, Hq, Hkv, new tokens, keys, D, block)
import sys
# argument 128: D=128 (a seventh case, 64 new tokens at 4 query heads a K/V head, is refused
# by attention_with_kvcache: 256 columns; the first run stopped there); 64: D=64
cases = {"128": [(16, 32, 8, 32, 32768, 128, 16), (16, 32, 8, 32, 4096, 128, 16), (1, 32, 8, 32, 32768, 128, 16),
                 (1, 32, 8, 32, 4096, 128, 16), (64, 32, 8, 32, 4096, 128, 16), (16, 64, 8, 16, 32768, 128, 16)],
         "64": [(16, 32, 8, 32, 32768, 64, 16), (1, 32, 8, 32, 32768, 64, 16), (16, 32, 8, 32, 4096, 64, 16),
                (1, 32, 8, 32, 4096, 64, 16), (16, 64, 8, 16, 32768, 64, 16)]}[sys.argv[1]]
for (B, Hq, Hkv, L, N, D, block) in cases:
    base = entry_for("sm_90").decode[D]
    launches = {"8 blocks": base, "4 blocks": dataclasses.replace(base, rows_wide_blocks=4)}
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    per = N // block
    kc = torch.randn(B * per, block, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(B * per, device="cuda").int().reshape(B, per)
    dense = [c[table.long()].flatten(1, 2).transpose(1, 2).contiguous() for c in (kc, vc)]
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    shape = DecodeShape(batch=B, head_dim=D, kv_heads=Hkv, group=Hq // Hkv, q_len=L, capacity=N,
                        block_size=block, causal=True, has_starts=False, has_lengths=True,
                        write_lse=False, num_splits=None)
    fns = {k: (lambda l=l: decode_forward(q, kc, vc, shape, scale=D ** -0.5, key_ends=lengths,
                                          block_table=table, launch=l)[0]) for k, l in launches.items()}
    fns["dense"] = lambda: attention_with_kvcache(q, *dense, lengths)
    outs = {k: f().float() for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = 2 * B * N * Hkv * D * 2
    r = [a / b for a, b in zip(times["4 blocks"], times["8 blocks"])]
    print(f"B={B} {Hq}/{Hkv} new={L} keys={N} D={D} block={block}: " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%, x{v/med['dense']:.3f} dense)" for k, v in med.items()) +
        f"; 4/8 blocks {med['4 blocks']/med['8 blocks']:.3f} [{min(r):.3f}-{max(r):.3f}]; max diff 4-8 "
        f"{(outs['4 blocks'] - outs['8 blocks']).abs().max().item():.1e}, 8-dense "
        f"{(outs['8 blocks'] - outs['dense']).abs().max().item():.1e}, NaN "
        f"{any(o.isnan().any().item() for o in outs.values())}", flush=True)
    del kc, vc, dense
    torch.cuda.empty_cache()
