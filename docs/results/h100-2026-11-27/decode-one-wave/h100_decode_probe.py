"""H100: (1) the one-wave decode launches at 32 and 64 columns (8 and 16 new tokens at 32/8
heads) against the package before them (88bfb77, cutile_fmha_old), through
attention_with_kvcache, as measured on the H200; (2) D=64 at 32 and 64 columns, 256-key
tiles at one CTA per SM and eight worker warps against the table's launch, with short
splits. bf16, causal at each sequence's last key, CUDA graphs, 3 rotating rounds."""
import dataclasses, statistics, sys, torch
import triton.testing as tt
import cutile_fmha as new
import cutile_fmha_old as old
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_forward
name = torch.cuda.get_device_name()
print(name, torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in name else 3.35e12
sms = torch.cuda.get_device_properties(0).multi_processor_count


def rounds(fns, rep=40):
    times = {n: [] for n in fns}; names = list(fns)
    for r in range(3):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(tt.do_bench_cudagraph(fns[n], rep=rep) * 1e3)
    return {n: statistics.median(t) for n, t in times.items()}


def paged(k, v, block_size, g):
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


def ab(D, q_len, batch, cache, layout="dense"):
    g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len + D)
    q = torch.randn(batch, 32, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, 8, cache, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    table = None
    if layout.startswith("paged"):
        (k, v), table = paged(k, v, int(layout[5:]), g)
    fns = {"before": lambda: old.attention_with_kvcache(q, k, v, lens, block_table=table),
           "one-wave": lambda: new.attention_with_kvcache(q, k, v, lens, block_table=table)}
    d = (fns["before"]().float() - fns["one-wave"]().float()).abs().max().item()
    assert d < 2e-2, d
    med = rounds(fns)
    nbytes = 2 * 8 * batch * cache * D * 2
    print(f"A/B D={D} {4 * q_len} columns {layout:7s} batch {batch:2d} x {cache:5d}: "
          + ", ".join(f"{n} {med[n]:7.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                      for n in fns)
          + f"; new / before {med['one-wave'] / med['before']:.3f}", flush=True)


def d64(q_len, batch, cache):
    D = 64
    table = dataclasses.replace(entry_for("sm_90").decode[D], one_wave_columns=None)
    launches = {"table": table,
                "256 o1 w8": dataclasses.replace(table, occupancy=1, num_worker_warps=8,
                                                 tile_n=256)}
    g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
    q = torch.randn(batch, 32, q_len, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(batch, 8, cache, D, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    splits = table.splits(batch * 8, cache, sms)
    shape = DecodeShape(batch=batch, head_dim=D, kv_heads=8, group=4, q_len=q_len,
                        capacity=cache, block_size=None, causal=True, has_starts=False,
                        has_lengths=True, write_lse=False, num_splits=splits)
    fns = {n: (lambda launch=launch: decode_forward(q, k, v, shape, scale=D ** -0.5,
                                                    key_ends=lens, launch=launch)[0])
           for n, launch in launches.items()}
    ref = fns["table"]().float()
    assert (fns["256 o1 w8"]().float() - ref).abs().max().item() < 2e-2
    med = rounds(fns)
    nbytes = 2 * batch * 8 * cache * D * 2
    print(f"D=64 {4 * q_len} columns batch {batch:2d} x {cache:5d} ({batch * 8 * splits} CTAs, "
          f"{cache // splits} keys a split): "
          + ", ".join(f"{n} {med[n]:6.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)"
                      for n in fns)
          + f"; 256 / table {med['256 o1 w8'] / med['table']:.3f}", flush=True)


if __name__ == "__main__":
    parts = sys.argv[1:] or ["ab", "d64"]
    if "ab" in parts:
        for batch, cache in ((1, 32768), (4, 8192), (16, 4096), (16, 32768), (32, 4096)):
            ab(128, 8, batch, cache)
        for batch, cache in ((1, 32768), (4, 8192), (16, 4096)):
            ab(128, 16, batch, cache)
        for q_len in (8, 16):
            for batch, cache in ((1, 16384), (16, 4096)):
                ab(256, q_len, batch, cache)
        ab(128, 8, 1, 32768, "paged64")
    if "d64" in parts:
        for q_len in (8, 16):
            for batch, cache in ((16, 4096), (1, 32768), (1, 4096), (1, 1024), (2, 8192),
                                 (4, 2048), (8, 1024)):
                d64(q_len, batch, cache)
