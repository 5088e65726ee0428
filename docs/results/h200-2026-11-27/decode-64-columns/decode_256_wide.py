"""D=256 at 16, 32 and 64 columns (4, 8 and 16 new tokens at 32/8 heads): the table's launch
(two CTAs per SM asked; at 32 and 64 columns the compiler takes 255 registers and no
producer warp, so one CTA per SM) against the wide launch (one CTA per SM, eight worker
warps) at every grid size, one wave and past it. And D=128 at 64 columns, where the
table's launch has no producer warp when split (and spills 416 bytes unsplit). decode_forward, bf16, dense caches, causal
at the last key, CUDA graphs, 3 rotating rounds."""
import dataclasses, statistics, torch
import triton.testing as tt
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
for D, q_len, shapes in (
        (256, 8, ((1, 16384), (16, 4096), (16, 16384), (32, 4096), (64, 4096))),
        (256, 16, ((1, 16384), (4, 8192), (16, 4096), (16, 16384), (32, 4096), (64, 4096))),
        (256, 4, ((16, 4096), (64, 4096))),
        (128, 16, ((1, 32768), (2, 16384), (4, 8192), (8, 8192), (16, 4096)))):
    table = dataclasses.replace(entry_for("sm_90").decode[D], one_wave_columns=None)
    launches = {"table": table, "wide": dataclasses.replace(table, wide_columns=4 * q_len)}
    for batch, cache in shapes:
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
               for n, launch in launches.items()}
        d = (fns["table"]().float() - fns["wide"]().float()).abs().max().item()
        assert d < 2e-2, d
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % 2:] + names[:r % 2]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * 8 * cache * D * 2
        print(f"D={D} q_len {q_len:2d} ({4 * q_len} columns) batch {batch:2d} x {cache:5d} "
              f"({batch * 8 * splits:3d} CTAs): " + ", ".join(
                  f"{n} {med[n]:6.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                  for n in names) + f"; wide / table {med['wide'] / med['table']:.3f}",
              flush=True)
