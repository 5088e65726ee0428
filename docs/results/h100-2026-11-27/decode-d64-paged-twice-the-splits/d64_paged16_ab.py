"""D=64, paged in blocks of 16 and 32, 16 columns (4 new tokens at 4 query heads a K/V head):
the table's launch (transposed products, 128-key tiles of 8 blocks, two CTAs per SM in
hints) against the one-wave launch on 128-key tiles (one CTA per SM, eight worker warps;
DecodeLaunch.one_wave_tiles=(128,...), one_wave_blocks=8) and against the table's launch in
twice the splits; the dense cache on the same keys at the table's rule; one process, 5
rotating rounds of CUDA-graph replays, bf16, causal at the last key, full lengths."""
import dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward, decode_plan
from cutile_fmha import attention_with_kvcache
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(name, flush=True)
torch.manual_seed(0)
ROUNDS = 5
D, Hq, Hkv, L = 64, 32, 8, 4
base = entry_for("sm_90").decode[D]
one_wave = dataclasses.replace(base, one_wave_tiles=(128, 128, 128), one_wave_blocks=8)
for (B, N, block) in [(16, 32768, 16), (16, 4096, 16), (8, 32768, 16), (1, 32768, 16), (1, 4096, 16),
                      (16, 32768, 32)]:
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
    splits = base.splits(B * Hkv, N, sms)
    twice = dataclasses.replace(shape, num_splits=2 * splits)
    runs = {"table": (shape, base), "one-wave 128": (shape, one_wave), f"{2 * splits} splits": (twice, base)}
    desc = {k: (lambda p: f"tile {p.constants['TILE_N']} {p.hints} grid {p.grid}")(decode_plan(s, l, sms, None))
            for k, (s, l) in runs.items()}
    fns = {k: (lambda s=s, l=l: decode_forward(q, kc, vc, s, scale=D ** -0.5, key_ends=lengths,
                                               block_table=table, launch=l)[0]) for k, (s, l) in runs.items()}
    fns["dense"] = lambda: attention_with_kvcache(q, *dense, lengths)
    outs = {k: f().float() for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = 2 * B * N * Hkv * D * 2
    print(f"B={B} keys={N} block={block}: " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%, x{v/med['table']:.3f} table, x{v/med['dense']:.3f} dense)"
        + (f" [{desc[k]}]" if k in desc else "") for k, v in med.items()) + "; max diff " +
        ", ".join(f"{(outs[k] - outs['table']).abs().max().item():.1e}" for k in fns if k != "table") +
        f", NaN {any(o.isnan().any().item() for o in outs.values())}", flush=True)
    del kc, vc, dense
    torch.cuda.empty_cache()
