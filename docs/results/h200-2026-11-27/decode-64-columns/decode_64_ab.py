"""The decode kernel at 64 columns (16 new tokens at 32/8 heads) with the one-wave launch
from 32 columns up (one CTA per SM, eight worker warps, the table's tiles, at one wave with
splits of at least one_wave_keys keys: cutile_fmha) against the committed package
(cutile_fmha_old: the table's launch at 64 columns), through attention_with_kvcache;
causal at each sequence's last key, bf16, CUDA graphs, 3 rotating rounds. D=64 and
batch 64 x 4k (512 CTAs) are controls: the same launch in both."""
import pathlib, statistics, sys, torch
import triton.testing as tt
import cutile_fmha as new
import cutile_fmha_old as old
sys.path.append(str(pathlib.Path(__file__).resolve().parents[1] / "decode-32-columns"))
from decode_32_ab import paged
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12


def case(D, batch, cache, layout="dense", heads=32, q_len=16, kv_heads=8):
    g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len + D)
    q = torch.randn(batch, heads, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, kv_heads, cache, D, device="cuda", dtype=torch.bfloat16,
                        generator=g) for _ in range(2))
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    table = None
    if layout.startswith("paged"):
        (k, v), table = paged(k, v, int(layout[5:]), g)
    fns = {"committed": lambda: old.attention_with_kvcache(q, k, v, lens, block_table=table),
           "one-wave": lambda: new.attention_with_kvcache(q, k, v, lens, block_table=table)}
    d = (fns["committed"]().float() - fns["one-wave"]().float()).abs().max().item()
    assert d < 2e-2, d
    times = {n: [] for n in fns}; names = list(fns)
    for r in range(3):
        for n in names[r % 2:] + names[:r % 2]:
            times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
    med = {n: statistics.median(t) for n, t in times.items()}
    nbytes = 2 * kv_heads * batch * cache * D * 2
    print(f"D={D} {heads}/{kv_heads} heads q_len {q_len} {layout:7s} batch {batch:2d} x {cache:5d}: "
          + ", ".join(f"{n} {med[n]:8.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                      for n in names)
          + f"; new / committed {med['one-wave'] / med['committed']:.3f}", flush=True)


for batch, cache in ((1, 32768), (4, 8192), (8, 8192), (16, 4096), (16, 32768), (64, 4096)):
    case(128, batch, cache)
for batch, cache in ((1, 16384), (16, 4096), (16, 16384), (64, 4096)):
    case(256, batch, cache)
case(64, 16, 4096)
for block_size in (16, 64):
    case(128, 1, 32768, f"paged{block_size}")
