"""The decode kernel at q_len 1-32 (32/8 heads, D=128, bf16, dense caches, causal at the
last key): the table's launch (128-key tiles, 2 CTAs per SM, the compiler's warps) against
launches with more registers a thread, which compile without spills where the table's
spills (q_len 8: 32 bytes, 16: 416). CUDA graphs, 3 rotating rounds; outputs against the
table's."""
import dataclasses, statistics, sys, torch
import triton.testing as tt
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
table = entry_for("sm_90").decode[128]
LAUNCHES = {"table 128 o2": table,
            "128 o1": dataclasses.replace(table, occupancy=1),
            "128 o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8),
            "64 o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8, tile_n=64)}
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
shapes = [(int(b), int(c)) for b, c in (x.split("x") for x in sys.argv[1].split(","))]
q_lens = [int(x) for x in sys.argv[2].split(",")]
for q_len in q_lens:
    for batch, cache in shapes:
        g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
        q = torch.randn(batch, 32, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, 8, cache, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        fns = {}
        for name, launch in LAUNCHES.items():
            splits = launch.splits(batch * 8, cache, 132)
            shape = DecodeShape(batch=batch, head_dim=128, kv_heads=8, group=4, q_len=q_len,
                                capacity=cache, block_size=None, causal=True, has_starts=False,
                                has_lengths=True, write_lse=False, num_splits=splits)
            fns[name] = (lambda shape=shape, launch=launch: decode_forward(
                q, k, v, shape, scale=128 ** -0.5, key_ends=lens, launch=launch)[0])
        ref = fns["table 128 o2"]()
        for name, fn in fns.items():
            d = (fn().float() - ref.float()).abs().max().item()
            assert d < 2e-2, (name, d)
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % len(names):] + names[:r % len(names)]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * 8 * cache * 128 * 2
        print(f"q_len {q_len:2d} batch {batch:2d} x {cache:5d}: " + ", ".join(
            f"{n} {med[n]:8.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)" for n in names), flush=True)
