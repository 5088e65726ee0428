"""Paged decode: blocks smaller than the key tile joined by ct.cat of one TMA load per block
(committed) against one ct.load_advanced_indexing over the tile's block ids (PAGED_GATHER=1).
Dense and paged times in one process; run alternately, one process per form.
bf16, 32/8 heads, D=128, q_len 1, CUDA graphs, rotating rounds."""
import os, statistics, sys
import torch, triton.testing as tt
import cuda.tile as ct
from cutile_fmha.kernels import decode as dk

FORM = "gather" if os.environ.get("PAGED_GATHER") == "1" else "cat"
ZERO = ct.PaddingMode.ZERO


def load_cache_tile(Cache, BlockTable, batch, kv_head, tile, TILE_N: dk.ConstInt,
                    TILE_D: dk.ConstInt, PAGED: dk.ConstBool, BLOCK_SIZE: dk.ConstInt):
    if not PAGED:
        return ct.load(Cache, index=(batch, kv_head, tile, 0), shape=(1, 1, TILE_N, TILE_D),
                       padding_mode=ZERO, latency=4).reshape((TILE_N, TILE_D))
    rows = min(TILE_N, BLOCK_SIZE)
    first = tile * TILE_N
    if TILE_N == rows:
        return dk.load_block_rows(Cache, BlockTable, batch, kv_head, first, rows, TILE_D, BLOCK_SIZE)
    blocks = ct.gather(BlockTable, (batch, first // BLOCK_SIZE
                                    + ct.arange(TILE_N // rows, dtype=ct.int32)))
    blocks = ct.minimum(ct.maximum(blocks, 0), Cache.shape[0] - 1)
    return ct.load_advanced_indexing(
        Cache, (blocks, ct.Slice(first % BLOCK_SIZE, rows), ct.Slice(kv_head, 1), ct.Slice(0, TILE_D)),
        padding_mode=ZERO, latency=4).reshape((TILE_N, TILE_D))


if FORM == "gather":
    dk.load_cache_tile = load_cache_tile
from cutile_fmha import attention_with_kvcache  # noqa: E402

print(torch.cuda.get_device_name(), FORM, flush=True)
H, HKV, D = 32, 8, 128
ROUNDS = int(os.environ.get("ROUNDS", "3"))
cases = [(1, 1024), (1, 4096), (1, 32768), (16, 4096), (64, 4096)]
for batch, cache in cases:
    g = torch.Generator(device="cuda").manual_seed(batch * 100003 + cache)
    q = torch.randn(batch, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(batch, HKV, cache, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    ragged = torch.randint(1, cache + 1, (batch,), dtype=torch.int32, device="cuda", generator=g)
    ragged[0] = cache - 5
    layouts = {"dense": (k, v, None)}
    for bs in (16, 32):
        nb = cache // bs
        perm = torch.randperm(batch * nb, device="cuda", generator=g)
        table = perm.view(batch, nb).to(torch.int32)
        kp = torch.empty(batch * nb, bs, HKV, D, device="cuda", dtype=torch.bfloat16)
        vp = torch.empty_like(kp)
        kp[table.flatten().long()] = k.view(batch, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(-1, bs, HKV, D)
        vp[table.flatten().long()] = v.view(batch, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(-1, bs, HKV, D)
        layouts[f"paged {bs}"] = (kp, vp, table)
    fns = {}
    for name, (kk, vv, bt) in layouts.items():
        for ln_name, ln in (("equal", lens), ("ragged", ragged)):
            ref = attention_with_kvcache(q, k, v, ln)
            out = attention_with_kvcache(q, kk, vv, ln, block_table=bt)
            err = (out.float() - ref.float()).abs().max().item()
            print(f"  {batch}x{cache} {name} {ln_name}: max |paged - dense| {err:.1e}", flush=True)
            assert err < 1e-2, (name, err)
        fns[name] = (lambda kk=kk, vv=vv, bt=bt: attention_with_kvcache(q, kk, vv, lens, block_table=bt))
    if batch == 16:
        fns["dense 2 splits"] = lambda: attention_with_kvcache(q, k, v, lens, num_splits=2)
    res = {key: [] for key in fns}
    keys = list(fns)
    for r in range(ROUNDS):
        for key in keys[r % len(keys):] + keys[:r % len(keys)]:
            res[key].append(tt.do_bench_cudagraph(fns[key], rep=100) * 1e3)
    dense = statistics.median(res["dense"])
    gbs = 2 * batch * HKV * cache * D * 2 / (dense * 1e-6) / 1e9
    print(f"{FORM} batch {batch} x {cache}: dense {dense:.2f} us ({gbs:.0f} GB/s)  " + "  ".join(
        f"{key} {statistics.median(res[key]):.2f} ({statistics.median(res[key]) / dense:.3f}x)"
        for key in keys[1:]), flush=True)
