"""The decode kernel on 2-CTA clusters (the `num_ctas=2` hint: tileiras runs each tile
block on two CTAs), against the table's launch and SDPA cuDNN: one new token, 32/8 heads,
D=128, bf16, dense caches of full length and paged ones in blocks of 16; five rotating
rounds of CUDA-graph replays, medians. Outputs checked for NaN and against float64 on
ragged lengths (0, 1, odd), and against the table launch's at the timed sizes."""
import json, math, statistics, sys
import torch, triton.testing as tt
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.kvcache import _decode_shape
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import DecodeLaunch
from cutile_fmha.steps.decode import decode_forward


class Clusters(DecodeLaunch):
    """The table's launch, each tile block on a cluster of two CTAs."""
    def choose(self, *args, **kwargs):
        on_m, tile_n, hints = super().choose(*args, **kwargs)
        return on_m, tile_n, hints | {"num_ctas": 2}


table = entry_for("sm_90").decode[128]
clusters = object.__new__(Clusters)
clusters.__dict__.update(table.__dict__)
LAUNCHES = {"table": None, "clusters": clusters}
HEADS, KV_HEADS, D, PEAK = 32, 8, 128, 3.35e12
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "table": str(table)}), flush=True)


def make(batch, cache, block, lengths, g):
    q = torch.randn(batch, HEADS, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    if block:
        per = math.ceil(cache / block)
        kc, vc = (torch.randn(batch * per, block, KV_HEADS, D, device="cuda",
                              dtype=torch.bfloat16, generator=g) for _ in range(2))
        table_ = torch.randperm(batch * per, device="cuda", generator=g).reshape(batch, per).int()
        dense_k = kc[table_.long()].reshape(batch, per * block, KV_HEADS, D).transpose(1, 2)
        dense_v = vc[table_.long()].reshape(batch, per * block, KV_HEADS, D).transpose(1, 2)
        return q, kc, vc, table_, dense_k, dense_v
    kc, vc = (torch.randn(batch, KV_HEADS, cache, D, device="cuda", dtype=torch.bfloat16,
                          generator=g) for _ in range(2))
    return q, kc, vc, None, kc, vc


def call(q, kc, vc, table_, lengths, launch):
    shape = _decode_shape(q, kc, vc, table_, False, True, False, False, None)
    return lambda: decode_forward(q, kc, vc, shape, scale=D ** -0.5, key_ends=lengths,
                                  block_table=table_, launch=launch)[0]


def reference(q, dense_k, dense_v, lengths):
    outs = []
    for b, n in enumerate(lengths.tolist()):
        k = dense_k[b:b + 1, :, :n].double().repeat_interleave(HEADS // KV_HEADS, 1)
        v = dense_v[b:b + 1, :, :n].double().repeat_interleave(HEADS // KV_HEADS, 1)
        outs.append(F.scaled_dot_product_attention(q[b:b + 1].double(), k, v) if n else
                    torch.zeros_like(q[b:b + 1], dtype=torch.float64))
    return torch.cat(outs)


g = torch.Generator(device="cuda").manual_seed(0)
for block in (None, 16):
    lengths = torch.tensor([0, 1, 77, 1000, 4095, 4096, 2049, 129], device="cuda",
                           dtype=torch.int32)
    q, kc, vc, table_, dk, dv = make(8, 4096, block, lengths, g)
    ref = reference(q, dk, dv, lengths)
    for name, launch in LAUNCHES.items():
        try:
            out = call(q, kc, vc, table_, lengths, launch)()
        except Exception as e:
            print(json.dumps({"check": name, "block": block, "failed": str(e)[:300]}), flush=True)
            continue
        print(json.dumps({"check": name, "block": block, "nan": bool(out.isnan().any()),
                          "max_err_vs_float64": (out.double() - ref).abs().max().item()}),
              flush=True)

CASES = [(16, 4096, None), (16, 8192, None), (64, 4096, None), (1, 4096, None),
         (1, 32768, None), (16, 32768, None), (1, 4096, 16), (16, 4096, 16)]
for batch, cache, block in CASES:
    lengths = torch.full((batch,), cache, device="cuda", dtype=torch.int32)
    q, kc, vc, table_, dk, dv = make(batch, cache, block, lengths, g)
    fns = {}
    for name, launch in LAUNCHES.items():
        fn = call(q, kc, vc, table_, lengths, launch)
        try:
            fn()
            fns[name] = fn
        except Exception as e:
            print(json.dumps({"batch": batch, "cache": cache, "block": block, "method": name,
                              "failed": str(e)[:300]}), flush=True)
    if block is None:
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        fns["cudnn"] = cudnn
    base = fns["table"]()
    diff = {name: (fn() - base).abs().max().item() for name, fn in fns.items()}
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(5):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(tt.do_bench_cudagraph(fns[name], rep=50) * 1e3)
    read = batch * KV_HEADS * cache * D * 2 * 2
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(json.dumps({"batch": batch, "cache": cache, "block": block, "method": name,
                          "us": med[name], "peak_share": read / (med[name] * 1e-6) / PEAK,
                          "over_table": med[name] / med["table"], "rounds_us": t,
                          "max_diff_vs_table": diff[name]}), flush=True)
