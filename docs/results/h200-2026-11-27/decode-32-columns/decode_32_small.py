"""Where the one-wave launch at 32 columns stops paying on short caches: the table's launch
(one_wave_columns None) against the one-wave launch at any split length (one_wave_keys 0),
through decode_forward, at few keys per CTA and few CTAs; D=128 and 256, 8 new tokens at 32/8 heads, bf16, dense caches, causal at
the last key, CUDA graphs, 3 rotating rounds."""
import dataclasses, statistics, torch
import triton.testing as tt
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
sms = torch.cuda.get_device_properties(0).multi_processor_count
for D, shapes in ((128, ((1, 512), (2, 512), (4, 512), (8, 512), (16, 512), (1, 1024),
                         (4, 1024), (16, 1024), (1, 2048), (8, 2048), (1, 4096))),
                  (256, ((16, 512), (1, 1024), (1, 4096)))):
    rule = entry_for("sm_90").decode[D]
    launches = {"table": dataclasses.replace(rule, one_wave_columns=None),
                "one-wave": dataclasses.replace(rule, one_wave_keys=0)}
    for batch, cache in shapes:
        g = torch.Generator(device="cuda").manual_seed(batch + cache + D)
        q = torch.randn(batch, 32, 8, D, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, 8, cache, D, device="cuda", dtype=torch.bfloat16,
                            generator=g) for _ in range(2))
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        splits = rule.splits(batch * 8, cache, sms)
        shape = DecodeShape(batch=batch, head_dim=D, kv_heads=8, group=4, q_len=8,
                            capacity=cache, block_size=None, causal=True, has_starts=False,
                            has_lengths=True, write_lse=False, num_splits=splits)
        fns = {n: (lambda launch=launch: decode_forward(q, k, v, shape, scale=D ** -0.5,
                                                        key_ends=lens, launch=launch)[0])
               for n, launch in launches.items()}
        d = (fns["table"]().float() - fns["one-wave"]().float()).abs().max().item()
        assert d < 2e-2, d
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % 2:] + names[:r % 2]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * 8 * cache * D * 2
        print(f"D={D} batch {batch:2d} x {cache:5d} ({batch * 8 * splits:3d} CTAs of "
              f"{cache // splits:4d} keys): " + ", ".join(
                  f"{n} {med[n]:6.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                  for n in names) + f"; one-wave / table {med['one-wave'] / med['table']:.3f}",
              flush=True)
