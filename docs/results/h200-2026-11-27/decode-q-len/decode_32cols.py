"""The decode kernel at 32 columns (8 new tokens at 4 query heads a K/V head, 4 at 8; D=128,
bf16, dense caches, causal at the last key): the table's launch against one CTA per SM with
64-key tiles, at one wave of CTAs and past it. CUDA graphs, 3 rotating rounds."""
import dataclasses, statistics, sys, torch
import triton.testing as tt
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
table = entry_for("sm_90").decode[128]
LAUNCHES = {"table 128 o2": table,
            "64 o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8, tile_n=64),
            "64 o1": dataclasses.replace(table, occupancy=1, tile_n=64),
            "64 o2": dataclasses.replace(table, tile_n=64)}
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
for heads, q_len in ((32, 8), (64, 4)):
    for batch, cache in ((1, 32768), (2, 16384), (4, 8192), (8, 8192), (16, 4096), (16, 32768), (32, 4096), (64, 4096)):
        g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
        q = torch.randn(batch, heads, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, 8, cache, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        fns, ctas = {}, None
        for name, launch in LAUNCHES.items():
            splits = launch.splits(batch * 8, cache, sms)
            ctas = batch * 8 * splits
            shape = DecodeShape(batch=batch, head_dim=128, kv_heads=8, group=heads // 8, q_len=q_len,
                                capacity=cache, block_size=None, causal=True, has_starts=False,
                                has_lengths=True, write_lse=False, num_splits=splits)
            fns[name] = (lambda shape=shape, launch=launch: decode_forward(
                q, k, v, shape, scale=128 ** -0.5, key_ends=lens, launch=launch)[0])
        ref = fns["table 128 o2"]().float()
        for name, fn in fns.items():
            assert (fn().float() - ref).abs().max().item() < 2e-2, name
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * 8 * cache * 128 * 2
        print(f"{heads}/8 heads q_len {q_len} batch {batch:2d} x {cache:5d} ({ctas} CTAs, {sms} SMs): " + ", ".join(
            f"{n} {med[n]:7.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%, {med[n] / med['table 128 o2']:.3f})" for n in names), flush=True)
