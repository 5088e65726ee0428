"""The decode kernel at 128 columns (heads of a K/V head x query rows) with the wide launch
(one CTA per SM, eight worker warps: cutile_fmha) against the committed table launch (two
CTAs per SM, the compiler's warps: cutile_fmha_old), through attention_with_kvcache; dense
caches, causal at the last key, bf16, CUDA graphs, 3 rotating rounds; 64 columns as the
control (the same launch in both)."""
import statistics, torch
import triton.testing as tt
import cutile_fmha as new
import cutile_fmha_old as old
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
for D, heads, kv_heads, q_len in ((128, 32, 8, 32), (64, 32, 8, 32), (256, 32, 8, 32),
                                   (128, 64, 8, 16), (128, 32, 8, 16)):
    for batch, cache in ((16, 32768), (16, 4096), (1, 32768), (64, 4096), (4, 8192)):
        if D == 256 and batch * cache > 16 * 32768 // 2:
            cache //= 2
        g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len + D)
        q = torch.randn(batch, heads, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, kv_heads, cache, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        fns = {"committed": lambda: old.attention_with_kvcache(q, k, v, lens),
               "wide launch": lambda: new.attention_with_kvcache(q, k, v, lens)}
        d = (fns["committed"]().float() - fns["wide launch"]().float()).abs().max().item()
        assert d < 2e-2, d
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % 2:] + names[:r % 2]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * kv_heads * cache * D * 2
        print(f"D={D} {heads}/{kv_heads} heads q_len {q_len} ({heads // kv_heads * q_len} columns) batch {batch} x {cache}: " + ", ".join(
            f"{n} {med[n]:8.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)" for n in names)
            + f"; new / committed {med['wide launch'] / med['committed']:.3f}", flush=True)
