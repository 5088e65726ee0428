"""D=64, 8 and 16 columns (1 and 4 new tokens at 4 query heads a K/V head) on a grid of at
most one CTA per SM: the table's launch (transposed products, 128-key tiles, two CTAs per SM
in hints) against the one-wave launch from 8 columns (one CTA per SM, eight worker warps,
256-key tiles: DecodeLaunch.one_wave_columns=8) and against the table's launch in twice the
splits; dense caches, one process, 5 rotating rounds of CUDA-graph replays, bf16, causal at
the last key, full lengths; outputs compared."""
import dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward, decode_plan
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(name, flush=True)
torch.manual_seed(0)
ROUNDS = 5
cases = [(16, 32768, 4), (16, 32768, 1), (16, 4096, 4), (16, 4096, 1), (8, 32768, 4), (4, 32768, 4),
         (1, 32768, 4), (1, 32768, 1), (16, 8192, 2)]
D, Hq, Hkv = 64, 32, 8
base = entry_for("sm_90").decode[D]
one_wave = dataclasses.replace(base, one_wave_columns=8, one_wave_tiles=(256, 256, 256, 256))
for (B, N, L) in cases:
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    kc, vc = (torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    shape = DecodeShape(batch=B, head_dim=D, kv_heads=Hkv, group=Hq // Hkv, q_len=L, capacity=N,
                        block_size=None, causal=True, has_starts=False, has_lengths=True,
                        write_lse=False, num_splits=None)
    splits = base.splits(B * Hkv, N, sms)
    twice = dataclasses.replace(shape, num_splits=2 * splits)
    runs = {"table": (shape, base), "one-wave": (shape, one_wave), f"{2 * splits} splits": (twice, base)}
    desc = {k: (lambda p: f"tile {p.constants['TILE_N']} {p.hints} grid {p.grid}")(decode_plan(s, l, sms, None))
            for k, (s, l) in runs.items()}
    fns = {k: (lambda s=s, l=l: decode_forward(q, kc, vc, s, scale=D ** -0.5, key_ends=lengths,
                                               launch=l)[0]) for k, (s, l) in runs.items()}
    outs = {k: f().float() for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = 2 * B * N * Hkv * D * 2
    print(f"B={B} keys={N} new={L} ({4 * max(L, 2)} columns): " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%, x{v/med['table']:.3f}) [{desc[k]}]"
        for k, v in med.items()) + "; max diff " +
        ", ".join(f"{(outs[k] - outs['table']).abs().max().item():.1e}" for k in fns if k != "table") +
        f", NaN {any(o.isnan().any().item() for o in outs.values())}", flush=True)
    del kc, vc
    torch.cuda.empty_cache()
