"""The decode kernel at one CTA per SM (occupancy 1: no 40-byte stack at blocks of 16, twice
the shared memory for loads in flight) against the table's launch (occupancy 2), where the
split rule's grid is about one CTA per SM anyway: one new token, 32/8 heads, D=128, bf16,
paged caches in blocks of 16 and 32 and dense ones, batch 1-4; five rotating rounds of
CUDA-graph replays, medians. Outputs checked first against float64 on ragged lengths with
NaN in the cache's unused rows.

    python paged_one_cta_ab.py > paged-one-cta-ab.log
"""
import dataclasses
import json
import math
import statistics

import torch
import torch.nn.functional as F
import triton.testing as tt
from cutile_fmha.kvcache import _decode_shape
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import DecodeLaunch
from cutile_fmha.steps.decode import decode_forward


@dataclasses.dataclass(frozen=True)
class WithHints(DecodeLaunch):
    """The table's launch with `extra` compiler hints (a field: the plans are cached per
    launch, which must then differ)."""
    extra: tuple = ()

    def choose(self, *args, **kwargs):
        on_m, tile_n, hints = super().choose(*args, **kwargs)
        return on_m, tile_n, hints | dict(self.extra)


def launch_with(**extra):
    table = entry_for("sm_90").decode[128]
    return WithHints(**{f.name: getattr(table, f.name) for f in dataclasses.fields(table)},
                     extra=tuple(extra.items()))


LAUNCHES = {"table": None, "occupancy 1": launch_with(occupancy=1),
            "occupancy 1, 8 warps": launch_with(occupancy=1, num_worker_warps=8)}
HEADS, KV_HEADS, D, PEAK = 32, 8, 128, 3.35e12
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)


def make(batch, cache, block, g):
    q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    if block is None:
        kc, vc = (torch.randn(batch, KV_HEADS, cache, D, device="cuda", dtype=torch.bfloat16,
                              generator=g) for _ in range(2))
        return q, kc, vc, None, kc, vc
    per = math.ceil(cache / block)
    kc, vc = (torch.randn(batch * per, block, KV_HEADS, D, device="cuda", dtype=torch.bfloat16,
                          generator=g) for _ in range(2))
    table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
    dense = [c[table.long()].reshape(batch, per * block, KV_HEADS, D).transpose(1, 2)
             for c in (kc, vc)]
    return q, kc, vc, table, *dense


def call(q, kc, vc, table, lengths, launch):
    shape = _decode_shape(q, kc, vc, table, False, True, False, False, None)
    return lambda: decode_forward(q, kc, vc, shape, scale=D ** -0.5, key_ends=lengths,
                                  block_table=table, launch=launch)[0]


g = torch.Generator(device="cuda").manual_seed(0)
for block in (16, None):
    lengths = torch.tensor([0, 1, 15, 17, 77, 1000, 4095, 4096], device="cuda",
                           dtype=torch.int32)
    q, kc, vc, table, dk, dv = make(len(lengths), 4096, block, g)
    ref = []
    for b, n in enumerate(lengths.tolist()):
        k = dk[b:b + 1, :, :n].double().repeat_interleave(HEADS // KV_HEADS, 1)
        v = dv[b:b + 1, :, :n].double().repeat_interleave(HEADS // KV_HEADS, 1)
        ref.append(F.scaled_dot_product_attention(q[b:b + 1].double(), k, v) if n else
                   torch.zeros_like(q[b:b + 1], dtype=torch.float64))
    ref = torch.cat(ref)
    if block is not None:  # NaN in every row past a sequence
        positions = torch.arange(table.shape[1] * block, device="cuda")
        past = positions[None, :] >= lengths[:, None]
        rows = (table.long()[:, positions // block] * block + positions % block)[past]
        for cache_ in (kc, vc):
            cache_.view(-1, KV_HEADS, D)[rows] = float("nan")
    for name, launch in LAUNCHES.items():
        out = call(q, kc, vc, table, lengths, launch)()
        print(json.dumps({"check": name, "block": block, "nan": bool(out.isnan().any()),
                          "max_err_vs_float64": (out.double() - ref).abs().max().item()}),
              flush=True)

CASES = [(1, 4096, 16), (1, 32768, 16), (4, 4096, 16), (1, 4096, 32), (1, 4096, None),
         (1, 32768, None), (4, 4096, None), (16, 4096, 16)]
for batch, cache, block in CASES:
    lengths = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
    q, kc, vc, table, _, _ = make(batch, cache, block, g)
    fns = {name: call(q, kc, vc, table, lengths, launch) for name, launch in LAUNCHES.items()}
    base = fns["table"]().clone()
    diff = {name: (fn() - base).abs().max().item() for name, fn in fns.items()}
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(5):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(tt.do_bench_cudagraph(fns[name], rep=30) * 1e3)
    read = batch * KV_HEADS * cache * D * 2 * 2
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(json.dumps({"batch": batch, "cache": cache, "block": block, "method": name,
                          "us": round(med[name], 2),
                          "peak_share": round(read / (med[name] * 1e-6) / PEAK, 3),
                          "over_table": round(med[name] / med["table"], 3),
                          "rounds_us": [round(x, 2) for x in t],
                          "max_diff_vs_table": diff[name]}), flush=True)
