"""The decode kernel at q_len 8-32 (32/8 heads, D=128, bf16, dense caches, causal at the
last key): committed (cutile_fmha_old: every tile transposed, S^T = K Q^T) against the
unmasked tiles with the columns on the products' M side (cutile_fmha: S = Q K^T, P in
registers; the masked tiles as before), at several launches. q_len 8 with 4 heads a K/V
head pads its 32 columns to 64. CUDA graphs, 3 rotating rounds. Correctness first: ragged
lengths, NaN in every cache slot past them, against float64."""
import dataclasses, statistics, sys, torch
import triton.testing as tt
import cutile_fmha_old as old
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps import decode as new_decode
from cutile_fmha.steps.decode import DecodeShape, decode_forward
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
table = entry_for("sm_90").decode[128]
LAUNCHES = {"new table 128 o2": table,
            "new 64 o1": dataclasses.replace(table, occupancy=1, tile_n=64),
            "new 128 o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8)}


def new_call(q, k, v, lens, launch, starts=None):
    batch, q_len = q.shape[0], q.shape[2]
    shape = DecodeShape(batch=batch, head_dim=128, kv_heads=8, group=4, q_len=q_len,
                        capacity=k.shape[2], block_size=None, causal=True,
                        has_starts=starts is not None, has_lengths=True, write_lse=False,
                        num_splits=launch.splits(batch * 8, k.shape[2], 132))
    return decode_forward(q, k, v, shape, scale=128 ** -0.5, key_starts=starts, key_ends=lens,
                          launch=launch)[0]


def reference(q, k, v, lens, starts):
    outs = []
    for b in range(q.shape[0]):
        s0, e = int(starts[b]), int(lens[b])
        kk, vv = (t[b:b + 1, :, s0:e].double().repeat_interleave(4, 1) for t in (k, v))
        s = (q[b:b + 1].double() @ kk.transpose(-1, -2)) / 128 ** 0.5
        n, m = s.shape[-2:]
        mask = torch.ones(n, m, dtype=torch.bool, device="cuda").tril(m - n)
        outs.append(torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ vv)
    return torch.cat(outs)


for threshold, q_lens in ((64, (16, 32)), (32, (8,))):
    new_decode.QUERIES_ON_M_COLUMNS = threshold
    new_decode._PLANS.clear()
    new_decode._plan_of_splits.cache_clear()
    for q_len in q_lens:
        for batch, cache in ((3, 1000), (2, 4500)):
            g = torch.Generator(device="cuda").manual_seed(q_len + cache)
            q = torch.randn(batch, 32, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(batch, 8, cache, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            lens = torch.randint(q_len + 130, cache + 1, (batch,), device="cuda", generator=g).int()
            starts = torch.randint(0, 100, (batch,), device="cuda", generator=g).int()
            for b in range(batch):
                k[b, :, lens[b]:] = float("nan"); v[b, :, lens[b]:] = float("nan")
                k[b, :, :starts[b]] = float("nan"); v[b, :, :starts[b]] = float("nan")
            ref = reference(q, k, v, lens, starts)
            line = [f"old {(old.attention_with_kvcache(q, k, v, lens, cache_leftpad=starts).double() - ref).abs().max().item():.2e}"]
            for name, launch in LAUNCHES.items():
                out = new_call(q, k, v, lens, launch, starts)
                assert torch.isfinite(out).all(), name
                line.append(f"{name} {(out.double() - ref).abs().max().item():.2e}")
            print(f"check q_len {q_len} batch {batch} x {cache} (ragged, left padding, NaN outside): max |x - float64| " + ", ".join(line), flush=True)
        for batch, cache in ((16, 32768), (16, 4096), (1, 32768), (64, 4096), (4, 8192)):
            g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
            q = torch.randn(batch, 32, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            k, v = (torch.randn(batch, 8, cache, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
            lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
            fns = {"committed": lambda: old.attention_with_kvcache(q, k, v, lens)}
            for name, launch in LAUNCHES.items():
                fns[name] = lambda launch=launch: new_call(q, k, v, lens, launch)
            ref = fns["committed"]().float()
            for name, fn in fns.items():
                d = (fn().float() - ref).abs().max().item()
                assert d < 2e-2, (name, d)
            times = {n: [] for n in fns}; names = list(fns)
            for r in range(3):
                for n in names[r % len(names):] + names[:r % len(names)]:
                    times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
            med = {n: statistics.median(t) for n, t in times.items()}
            nbytes = 2 * batch * 8 * cache * 128 * 2
            print(f"q_len {q_len:2d} batch {batch:2d} x {cache:5d}: " + ", ".join(
                f"{n} {med[n]:7.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)" for n in names), flush=True)
