"""The decode kernel at 32 columns (heads of a K/V head x query rows: 8 new tokens at 32/8
heads, 4 at 64/8) with the one-wave launch (64-key tiles, one CTA per SM, eight worker warps
while batch x kv_heads x splits <= SMs: cutile_fmha) against the committed table launch
(cutile_fmha_old), through attention_with_kvcache; causal at each sequence's last key,
bf16, CUDA graphs, 3 rotating rounds. 256 CTAs (batch 32 x 4k) is the control: the same
launch in both."""
import statistics, torch
import triton.testing as tt
import cutile_fmha as new
import cutile_fmha_old as old
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
DENSE = ((1, 512), (1, 32768), (4, 8192), (16, 4096), (16, 32768), (32, 4096))


def paged(k, v, block_size, g):
    """The dense cache (batch, kv_heads, n, D) as shuffled blocks and a block table."""
    batch, kv_heads, n, D = k.shape
    per_seq = n // block_size
    order = torch.randperm(batch * per_seq, device="cuda", generator=g)
    table = order.view(batch, per_seq).to(torch.int32)
    caches = []
    for c in (k, v):
        blocks = c.view(batch, kv_heads, per_seq, block_size, D).permute(0, 2, 3, 1, 4) \
            .reshape(batch * per_seq, block_size, kv_heads, D)
        out = torch.empty_like(blocks)
        out[order] = blocks
        caches.append(out)
    return caches, table


def case(D, heads, q_len, batch, cache, layout="dense", kv_heads=8):
    g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len + D)
    q = torch.randn(batch, heads, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, kv_heads, cache, D, device="cuda", dtype=torch.bfloat16,
                        generator=g) for _ in range(2))
    if layout == "ragged":
        lens = torch.randint(cache // 8, cache + 1, (batch,), device="cuda", generator=g,
                             dtype=torch.int32)
    else:
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
    nbytes = 2 * kv_heads * int(lens.sum()) * D * 2
    print(f"D={D} {heads}/{kv_heads} heads q_len {q_len} {layout:7s} batch {batch:2d} x {cache:5d}: "
          + ", ".join(f"{n} {med[n]:8.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                      for n in names)
          + f"; new / committed {med['one-wave'] / med['committed']:.3f}", flush=True)


if __name__ == "__main__":
    for D in (128, 64, 256):
        for batch, cache in DENSE:
            case(D, 32, 8, batch, cache if D < 256 or cache < 32768 else cache // 2)
    for batch, cache in ((1, 32768), (16, 4096), (16, 32768)):
        case(128, 64, 4, batch, cache)
    case(128, 32, 8, 16, 32768, "ragged")
    for block_size in (16, 64):
        for batch, cache in ((1, 32768), (16, 4096)):
            case(128, 32, 8, batch, cache, f"paged{block_size}")
