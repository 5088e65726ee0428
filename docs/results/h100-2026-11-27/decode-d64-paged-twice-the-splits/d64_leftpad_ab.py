"""D=64, paged in blocks of 16 with left padding (cache_leftpad: the products stay
transposed), 32 columns (8 new tokens at 4 query heads a K/V head): the rule's splits
before (one CTA per SM) against twice them (DecodeLaunch.one_wave_refused_ctas_per_sm=2),
left padding of 0 keys; one process, 5 rotating rounds of CUDA-graph replays, bf16, causal
at the last key, full lengths."""
import dataclasses, statistics
import torch, triton
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
print(name, flush=True)
torch.manual_seed(0)
D, Hq, Hkv = 64, 32, 8
base = dataclasses.replace(entry_for("sm_90").decode[D], one_wave_refused_ctas_per_sm=None)
for (B, N, L, block) in [(16, 32768, 8, 16), (8, 32768, 8, 16), (1, 32768, 8, 16), (16, 4096, 8, 16),
                         (16, 32768, 4, 16), (16, 32768, 8, 32)]:
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    per = N // block
    kc = torch.randn(B * per, block, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(B * per, device="cuda").int().reshape(B, per)
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    starts = torch.zeros(B, device="cuda", dtype=torch.int32)
    shape = DecodeShape(batch=B, head_dim=D, kv_heads=Hkv, group=Hq // Hkv, q_len=L, capacity=N,
                        block_size=block, causal=True, has_starts=True, has_lengths=True,
                        write_lse=False, num_splits=None)
    splits = base.splits(B * Hkv, N, sms)
    runs = {f"{splits} splits": dataclasses.replace(shape, num_splits=splits),
            f"{2 * splits} splits": dataclasses.replace(shape, num_splits=2 * splits)}
    fns = {k: (lambda s=s: decode_forward(q, kc, vc, s, scale=D ** -0.5, key_starts=starts,
                                          key_ends=lengths, block_table=table, launch=base)[0])
           for k, s in runs.items()}
    outs = {k: f().float() for k, f in fns.items()}
    times = {k: [] for k in fns}
    for _ in range(5):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    first = next(iter(med))
    nbytes = 2 * B * N * Hkv * D * 2
    print(f"B={B} keys={N} new={L} block={block}: " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%, x{v/med[first]:.3f})" for k, v in med.items())
        + f"; max diff {max((o - outs[first]).abs().max().item() for o in outs.values()):.1e}, NaN "
        f"{any(o.isnan().any().item() for o in outs.values())}", flush=True)
    del kc, vc
    torch.cuda.empty_cache()
