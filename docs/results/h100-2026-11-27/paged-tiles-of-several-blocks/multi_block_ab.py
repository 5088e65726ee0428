"""Paged caches in blocks of 16 and 32 with the columns on the M side: tiles of one block
(HEAD, cutile_fmha_old) against 64-key tiles of several blocks (working tree), and the
dense cache on the same keys; one process, rotating rounds of CUDA-graph replays, bf16,
causal at the last key; outputs compared with each other and a float64 reference."""
import sys, statistics
sys.path.insert(0, ".scratch/pk")
import torch, triton
import cutile_fmha, cutile_fmha_old
from cutile_fmha import attention_with_kvcache
name = torch.cuda.get_device_name()
peak = 3.35e12 if "H100" in name else 4.8e12
print(name, flush=True)
torch.manual_seed(0)
ROUNDS = 5
# (batch, Hq, Hkv, new tokens, keys, D, block, ragged ends)
cases = [(16, 32, 8, 16, 4096, 128, 16, False), (16, 32, 8, 16, 32768, 128, 16, False),
         (16, 32, 8, 32, 4096, 128, 16, False), (16, 32, 8, 32, 32768, 128, 16, False),
         (1, 32, 8, 16, 32768, 128, 16, False), (1, 32, 8, 32, 32768, 128, 16, False),
         (64, 32, 8, 16, 4096, 128, 16, False),
         (16, 32, 8, 16, 32768, 128, 32, False), (16, 32, 8, 32, 32768, 128, 32, False),
         (16, 32, 8, 16, 32768, 64, 16, False), (16, 32, 8, 32, 32768, 64, 16, False),
         (16, 32, 8, 16, 16384, 256, 16, False), (16, 32, 8, 32, 16384, 256, 32, False),
         (16, 32, 8, 32, 8192, 128, 16, True), (16, 64, 8, 16, 8192, 128, 16, True)]
for (B, Hq, Hkv, L, N, D, block, ragged) in cases:
    q = torch.randn(B, Hq, L, D, device="cuda", dtype=torch.bfloat16)
    per = N // block
    kc = torch.randn(B * per, block, Hkv, D, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    table = torch.randperm(B * per, device="cuda").int().reshape(B, per)
    dense = [c[table.long()].flatten(1, 2).transpose(1, 2).contiguous() for c in (kc, vc)]
    lengths = torch.full((B,), N, device="cuda", dtype=torch.int32)
    if ragged:
        lengths = torch.randint(L, N + 1, (B,), device="cuda", dtype=torch.int32)
        lengths[0] = N - 37
        if B > 2:
            lengths[1], lengths[2] = L + 1, N - 64 - 5
    fns = {"one-block": lambda: cutile_fmha_old.attention_with_kvcache(q, kc, vc, lengths, block_table=table),
           "multi-block": lambda: cutile_fmha.attention_with_kvcache(q, kc, vc, lengths, block_table=table),
           "dense": lambda: attention_with_kvcache(q, *dense, lengths)}
    outs = {k: f().float() for k, f in fns.items()}
    # float64 reference on the first and last sequences
    errs = []
    for b in (0, B - 1):
        n = int(lengths[b])
        k64 = dense[0][b, :, :n].double().repeat_interleave(Hq // Hkv, 0)
        v64 = dense[1][b, :, :n].double().repeat_interleave(Hq // Hkv, 0)
        s = q[b].double() @ k64.transpose(-1, -2) * D ** -0.5
        qi = torch.arange(L, device="cuda")[:, None] + n - L
        s = s.masked_fill(torch.arange(n, device="cuda")[None, :] > qi, float("-inf"))
        ref = torch.softmax(s, -1) @ v64
        errs.append(max((outs[k][b].double() - ref).abs().max().item() for k in ("one-block", "multi-block")))
    times = {k: [] for k in fns}
    for _ in range(ROUNDS):
        for k, f in fns.items():
            times[k].append(triton.testing.do_bench_cudagraph(f, rep=100))
    med = {k: statistics.median(v) for k, v in times.items()}
    nbytes = 2 * int(lengths.sum()) * Hkv * D * 2
    r = [a / b for a, b in zip(times["multi-block"], times["one-block"])]
    print(f"B={B} {Hq}/{Hkv} new={L} keys={N}{' ragged' if ragged else ''} D={D} block={block}: " + ", ".join(
        f"{k} {v*1e3:.1f} us ({nbytes/(v*1e-3)/peak*100:.1f}%)" for k, v in med.items()) +
        f"; multi/one {med['multi-block']/med['one-block']:.3f} [{min(r):.3f}-{max(r):.3f}], "
        f"multi/dense {med['multi-block']/med['dense']:.3f}, one/dense {med['one-block']/med['dense']:.3f}; "
        f"max |multi-one| {(outs['multi-block'] - outs['one-block']).abs().max().item():.1e}, "
        f"max err vs float64 {max(errs):.1e}, NaN {any(o.isnan().any().item() for o in outs.values())}", flush=True)
    del kc, vc, dense
    torch.cuda.empty_cache()
