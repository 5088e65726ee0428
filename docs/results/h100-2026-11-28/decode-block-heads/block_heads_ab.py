"""The block-heads probe (block_heads.py) against the package's decode kernel on the same
paged cache and on a dense one, and SDPA cuDNN on the dense one: one new token, 32/8
heads, D=128, bf16, equal lengths; five rotating rounds of CUDA-graph replays, medians.
The probe runs several split counts and launches; each is checked first against float64
on ragged lengths (0, 1, block edges, odd) with NaN in the cache's unused rows and the
output poisoned with NaN.

    python block_heads_ab.py > block-heads-ab.log
"""
import json
import math
import statistics
import sys
from pathlib import Path

import cuda.tile as ct
import torch
import torch.nn.functional as F
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).parent))
from block_heads import decode_block_heads  # noqa: E402
from cutile_fmha.kernels import decode as decode_kernels  # noqa: E402
from cutile_fmha.kvcache import _decode_shape  # noqa: E402
from cutile_fmha.steps.decode import decode_forward, power_of_two_at_least  # noqa: E402
from cutile_fmha.steps.family import UNUSED_ARRAY  # noqa: E402
from cutile_fmha.steps.launcher import current_stream, with_hints  # noqa: E402

HEADS, KV_HEADS, D = 32, 8, 128
GROUP = HEADS // KV_HEADS
PEAK = 3.35e12 if "H100" in torch.cuda.get_device_name() else 4.8e12
LAUNCHES = {"h8": (8, {"occupancy": 2}), "h4": (4, {"occupancy": 2}),
            "h8w8": (8, {"occupancy": 1, "num_worker_warps": 8})}
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}), flush=True)


def make(batch, cache, block, g):
    q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    per = math.ceil(cache / block)
    kc, vc = (torch.randn(batch * per, block, KV_HEADS, D, device="cuda", dtype=torch.bfloat16,
                          generator=g) for _ in range(2))
    table = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
    dense = [c[table.long()].reshape(batch, per * block, KV_HEADS, D).transpose(1, 2)
             .contiguous() for c in (kc, vc)]
    return q, kc, vc, table, dense


def package(q, kc, vc, table, lengths):
    shape = _decode_shape(q, kc, vc, table, False, True, False, False, None)
    return lambda: decode_forward(q, kc, vc, shape, scale=D ** -0.5, key_ends=lengths,
                                  block_table=table)[0]


def probe(q, kc, vc, table, lengths, heads, hints, splits):
    batch, block = q.shape[0], kc.shape[1]
    tiles, columns = KV_HEADS // heads, max(heads * GROUP, 8)
    kernel = with_hints(decode_block_heads, hints)
    out = torch.empty_like(q)
    split = splits > 1
    partial = torch.empty(batch, tiles, splits, columns, D, device="cuda") if split \
        else UNUSED_ARRAY
    partial_lse = torch.empty(batch, tiles, splits, columns, device="cuda") if split \
        else UNUSED_ARRAY
    args = (q, kc, vc, out, UNUSED_ARRAY, partial, partial_lse, lengths, table, D ** -0.5,
            D, block, heads, GROUP, columns, split, False)
    merge_args = (partial, partial_lse, out, UNUSED_ARRAY, D, power_of_two_at_least(splits),
                  heads * GROUP, 1, False)

    def run():
        stream = current_stream(q.device)
        ct.launch(stream, (splits, tiles, batch), kernel, args)
        if split:
            ct.launch(stream, (heads * GROUP, tiles, batch), decode_kernels.merge_splits,
                      merge_args, programmatic_dependent_launch=True)
        return out
    return run, out


def reference(q, dense_k, dense_v, lengths):
    outs = []
    for b, n in enumerate(lengths.tolist()):
        k = dense_k[b:b + 1, :, :n].double().repeat_interleave(GROUP, 1)
        v = dense_v[b:b + 1, :, :n].double().repeat_interleave(GROUP, 1)
        outs.append(F.scaled_dot_product_attention(q[b:b + 1].double(), k, v) if n else
                    torch.zeros_like(q[b:b + 1], dtype=torch.float64))
    return torch.cat(outs)


g = torch.Generator(device="cuda").manual_seed(0)
for block in (16, 32):
    lengths = torch.tensor([0, 1, 15, 16, 17, 77, 1000, 4095, 4096, 2049, 129, 31],
                           device="cuda", dtype=torch.int32)
    q, kc, vc, table, (dk, dv) = make(len(lengths), 4096, block, g)
    # NaN in every cache row past a sequence's end (a block's unused rows, unused blocks)
    positions = torch.arange(table.shape[1] * block, device="cuda")
    past = positions[None, :] >= lengths[:, None]
    rows = (table.long()[:, positions // block] * block + positions % block)[past]
    for cache_ in (kc, vc):
        cache_.view(-1, KV_HEADS, D)[rows] = float("nan")
    ref = reference(q, dk, dv, lengths)
    tol = (package(q, kc, vc, table, lengths)().double() - ref).abs().max().item()
    for name, (heads, hints) in LAUNCHES.items():
        for splits in (1, 3, 16, 64):
            try:
                run, out = probe(q, kc, vc, table, lengths, heads, hints, splits)
                out.fill_(float("nan"))
                run()
                err = (out.double() - ref).abs().max().item()
                print(json.dumps({"check": name, "block": block, "splits": splits,
                                  "nan": bool(out.isnan().any()), "max_err_vs_float64": err,
                                  "package_err": tol}), flush=True)
            except Exception as e:  # noqa: BLE001
                print(json.dumps({"check": name, "block": block, "splits": splits,
                                  "failed": str(e)[:400]}), flush=True)

CASES = [(1, 4096, 16, (16, 32, 64, 128)), (1, 32768, 16, (32, 64, 128)),
         (4, 4096, 16, (8, 16, 32, 64)), (16, 4096, 16, (1, 2, 4, 8, 16)),
         (16, 32768, 16, (1, 4, 8, 16)), (64, 4096, 16, (1, 2, 4)),
         (1, 4096, 32, (16, 32, 64)), (16, 4096, 32, (1, 4, 8)), (16, 32768, 32, (1, 8))]
for batch, cache, block, split_counts in CASES:
    lengths = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
    q, kc, vc, table, (dk, dv) = make(batch, cache, block, g)
    fns = {"paged": package(q, kc, vc, table, lengths),
           "dense": package(q, dk, dv, None, lengths)}

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, dk, dv, enable_gqa=True)
    fns["cudnn"] = cudnn
    for name, (heads, hints) in LAUNCHES.items():
        for splits in split_counts:
            fns[f"{name} s{splits}"] = probe(q, kc, vc, table, lengths, heads, hints, splits)[0]
    base = fns["dense"]().clone()
    diff = {}
    for name, fn in list(fns.items()):
        try:
            diff[name] = (fn() - base).abs().max().item()
        except Exception as e:  # noqa: BLE001
            print(json.dumps({"batch": batch, "cache": cache, "method": name,
                              "failed": str(e)[:300]}), flush=True)
            del fns[name]
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(5):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(tt.do_bench_cudagraph(fns[name], rep=30) * 1e3)
    read = batch * KV_HEADS * cache * D * 2 * 2
    med = {name: statistics.median(t) for name, t in times.items()}
    best = min((n for n in med if n[0] == "h"), key=med.get)
    print(json.dumps({"batch": batch, "cache": cache, "block": block,
                      "dense_us": med["dense"], "paged_over_dense": med["paged"] / med["dense"],
                      "best_probe": best, "best_probe_over_dense": med[best] / med["dense"],
                      "cudnn_over_dense": med["cudnn"] / med["dense"]}), flush=True)
    for name, t in times.items():
        print(json.dumps({"batch": batch, "cache": cache, "block": block, "method": name,
                          "us": round(med[name], 2), "peak_share": read / (med[name] * 1e-6) / PEAK,
                          "over_dense": med[name] / med["dense"],
                          "rounds_us": [round(x, 2) for x in t],
                          "max_diff_vs_dense": diff[name]}), flush=True)
