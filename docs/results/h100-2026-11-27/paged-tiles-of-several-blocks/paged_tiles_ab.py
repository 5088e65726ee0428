"""Paged caches in blocks of 16 and 32 with the columns on the M side: tiles of one block
against tiles of 32, 64 and 128 keys of several blocks (DecodeLaunch.rows_paged_tiles), and
the dense cache on the same keys; one process, rotating rounds of CUDA-graph replays, bf16,
causal at the last key, full lengths; outputs compared with the first launch's."""
import sys, dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
from cutile_fmha import attention_with_kvcache
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)
torch.manual_seed(0)
ROUNDS = 3
# (batch, Hq, Hkv, new tokens, keys, D, block)
cases = {"64": [(16, 32, 8, 16, 4096, 128, 16), (16, 32, 8, 16, 32768, 128, 16), (1, 32, 8, 16, 32768, 128, 16),
                (16, 32, 8, 16, 32768, 128, 32), (16, 32, 8, 16, 32768, 64, 16), (16, 32, 8, 16, 16384, 256, 16)],
         "128": [(16, 32, 8, 32, 32768, 128, 16), (1, 32, 8, 32, 32768, 128, 16), (16, 32, 8, 32, 32768, 128, 32),
                 (16, 32, 8, 32, 32768, 64, 16), (16, 32, 8, 32, 16384, 256, 32), (16, 32, 8, 32, 4096, 128, 16)]}
for (B, Hq, Hkv, L, N, D, block) in cases[sys.argv[1]]:
    base = entry_for("sm_90").decode[D]
    launches = {}
    for floor in (block, 32, 64, 128):
        tile = min(base.tile_n, max(block, floor))
        if f"tile {tile}" not in launches:
            launches[f"tile {tile}"] = dataclasses.replace(base, rows_paged_tiles=(floor, floor))
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
    first = next(iter(launches))
    print(f"B={B} {Hq}/{Hkv} new={L} keys={N} D={D} block={block}: " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%, x{v/med['dense']:.3f} dense)" for k, v in med.items()) +
        "; max diff from " + first + " " +
        ", ".join(f"{(outs[k] - outs[first]).abs().max().item():.1e}" for k in fns if k != first), flush=True)
    del kc, vc, dense
    torch.cuda.empty_cache()
