"""D=64 at 32 and 64 columns (8 and 16 new tokens at 32/8 heads), where the table's launch
compiles clean (128 registers, no spill, a producer warp) yet reads at 31-47% of the peak:
other tiles and launches. decode_forward, bf16, dense caches, causal at the last key, CUDA
graphs, 3 rotating rounds."""
import dataclasses, statistics, torch
import triton.testing as tt
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
D = 64
table = dataclasses.replace(entry_for("sm_90").decode[D], one_wave_columns=None)
LAUNCHES = {"table": table,
            "o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8),
            "256 o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8, tile_n=256),
            "64 o2": dataclasses.replace(table, tile_n=64)}
for q_len in (8, 16):
    for batch, cache in ((16, 4096), (1, 32768), (64, 4096)):
        g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
        q = torch.randn(batch, 32, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, 8, cache, D, device="cuda", dtype=torch.bfloat16,
                            generator=g) for _ in range(2))
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        splits = table.splits(batch * 8, cache, sms)
        shape = DecodeShape(batch=batch, head_dim=D, kv_heads=8, group=4, q_len=q_len,
                            capacity=cache, block_size=None, causal=True, has_starts=False,
                            has_lengths=True, write_lse=False, num_splits=splits)
        fns = {n: (lambda launch=launch: decode_forward(q, k, v, shape, scale=D ** -0.5,
                                                        key_ends=lens, launch=launch)[0])
               for n, launch in LAUNCHES.items()}
        ref = fns["table"]().float()
        for n, fn in fns.items():
            assert (fn().float() - ref).abs().max().item() < 2e-2, n
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=40) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * 8 * cache * D * 2
        print(f"D={D} {4 * q_len} columns batch {batch:2d} x {cache:5d} ({batch * 8 * splits} CTAs): "
              + ", ".join(f"{n} {med[n]:6.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%, "
                          f"{med[n] / med['table']:.3f})" for n in names), flush=True)
