"""D=64, 8 and 16 columns (1 and 4 new tokens at 4 query heads a K/V head): the table's
launch (transposed below 32 columns) against rows_padded_columns=4 (padded to 64 columns on
the products' M side), dense and paged in blocks of 16; one process, 3 rotating rounds of
CUDA-graph replays, bf16, causal at the last key, full lengths; outputs compared."""
import dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)
torch.manual_seed(0)
ROUNDS = 3
cases = [(B, 32, 8, L, N, 64, block) for L in (1, 4) for (B, N) in ((16, 32768), (1, 32768), (1, 4096), (64, 4096))
         for block in (None, 16)]
for (B, Hq, Hkv, L, N, D, block) in cases:
    base = entry_for("sm_90").decode[D]
    launches = {"transposed": base,
                "padded": dataclasses.replace(base, rows_padded_columns=4)}
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    if block is None:
        kc, vc = (torch.randn(B, Hkv, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        table = None
    else:
        per = N // block
        kc, vc = (torch.randn(B * per, block, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        table = torch.randperm(B * per, device="cuda").int().reshape(B, per)
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    shape = DecodeShape(batch=B, head_dim=D, kv_heads=Hkv, group=Hq // Hkv, q_len=L, capacity=N,
                        block_size=block, causal=True, has_starts=False, has_lengths=True,
                        write_lse=False, num_splits=None)
    fns = {k: (lambda l=l: decode_forward(q, kc, vc, shape, scale=D ** -0.5, key_ends=lengths,
                                          block_table=table, launch=l)[0]) for k, l in launches.items()}
    outs = {k: f().float() for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = 2 * B * N * Hkv * D * 2
    r = [a / b for a, b in zip(times["padded"], times["transposed"])]
    print(f"B={B} {Hq}/{Hkv} new={L} keys={N} D={D} {'dense' if block is None else f'paged {block}'}: " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%)" for k, v in med.items()) +
        f"; padded/transposed {med['padded']/med['transposed']:.3f} [{min(r):.3f}-{max(r):.3f}]; max diff "
        f"{(outs['padded'] - outs['transposed']).abs().max().item():.1e}, NaN "
        f"{any(o.isnan().any().item() for o in outs.values())}", flush=True)
    del kc, vc
    torch.cuda.empty_cache()
