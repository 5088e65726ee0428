"""The backward with dQ added atomically by dK/dV ("dkdv_dq") against the two kernels and
cuDNN, one process, rotating rounds of CUDA-graph replays (cuDNN eager, as the backward
benchmark times it). Parts: grid (the platform's choice vs the package at HEAD, cutile_fmha_old,
vs cuDNN), d128 (two kernels both: the extra parameter), threshold (fused forced vs pair
forced at small grids), variants, varlen; later softcap128, d96 and rule128 (the one kernel
at 64x128 forced against the two at D=128 with a softcap or window, D=96 and D=80), mla and
wide (D_qk=192 and 160 split or padded in the one kernel), mla32 (192/128 on its own 32x128
tiles). One JSON line per shape."""
import dataclasses, json, statistics, sys
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps import backward as launcher
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.steps.variants import Variants
from cutile_fmha.steps.varlen import SequenceBounds, varlen_backward, varlen_forward
from cutile_fmha.steps.launcher import device_facts
from cutile_fmha_old.steps.backward import attention_backward as old_backward

ROUNDS = 3
BASE = backward_entry_for(device_facts(torch.device("cuda"))[0])
FUSED = dataclasses.replace(BASE, launches={d: {"dkdv_dq": k["dkdv"]} | k for d, k in BASE.launches.items()})
PAIR = dataclasses.replace(BASE, launches={d: {n: k[n] for n in ("dkdv", "dq")} for d, k in BASE.launches.items()},
                           **({"exact_launches": {}} if hasattr(BASE, "exact_launches") else {}))


def fused_at(head_dim, kind):
    """The entry whose D=head_dim backward is "dkdv_dq" at the tiles named "fused MxN"."""
    from cutile_fmha.platforms import TileShape
    from cutile_fmha.platforms.backward import BackwardLaunch
    tiles = TileShape(*map(int, kind.split()[1].split("x")))
    launches = dict(FUSED.launches) | {head_dim: FUSED.launches[head_dim] | {"dkdv_dq": BackwardLaunch(tiles, 8)}}  # noqa
    return dataclasses.replace(FUSED, launches=launches)


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(label, fns, flops, check):
    res = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=120))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(json.dumps({"shape": label, "ms": med, "tflops": {n: flops / m / 1e9 for n, m in med.items()},
                      "over_cudnn_speed": {n: med["cudnn"] / m for n, m in med.items()} if "cudnn" in med else None,
                      "rounds": res, "check": check}), flush=True)


def dense(B, H, HKV, N, D, causal, kinds, variants=None):
    g = torch.Generator(device="cuda").manual_seed(N + D + H)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    var = variants or Variants()
    left, right, softcap = var.operator_arguments()
    kw = dict(window_size=(left, right) if var.window else (-1, -1), softcap=var.softcap) if variants else {}
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H, **kw)
    fns, grads = {}, {}
    for kind in kinds:
        if kind == "cudnn":
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HKV != H)
            fns[kind] = lambda o=o, qg=qg, kg=kg, vg=vg: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
        elif kind == "old":
            fns[kind] = lambda: old_backward(q, k, v, out, lse, do, causal=causal)
        else:
            entry = {"ours": BASE, "fused": FUSED, "pair": PAIR}.get(kind) or fused_at(128 if D < 128 and D != 64 else D, kind)
            fns[kind] = lambda entry=entry: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry, variants=var)
        grads[kind] = fns[kind]()
    torch.cuda.synchronize()
    ref = grads.get("pair", grads.get("old"))
    check = {kind: [rel(a, b) for a, b in zip(grads[kind], ref)] for kind in grads if kind != "cudnn"}
    # which launches the default took: the fused one writes dQ through a float32 buffer
    flops = 2.5 * 4 * B * H * N * N * D / (2 if causal else 1)
    label = f"B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}" + (f" {variants}" if variants else "")
    run(label, fns, flops, check)


def varlen(lengths, H, HKV, D, causal):
    g = torch.Generator(device="cuda").manual_seed(len(lengths))
    total = sum(lengths)
    q, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    views = [t.transpose(0, 1)[None] for t in (q, k, v, do)]
    bounds = SequenceBounds.packed(cu, cu)
    m = max(lengths)
    out, lse = varlen_forward(*views[:3], bounds, m, causal=causal, scale=D ** -0.5, with_lse=True)
    fns, grads = {}, {}
    for kind, entry in (("fused", FUSED), ("pair", PAIR)):
        def fn(entry=entry):
            launcher.backward_entry_for = lambda arch: entry
            return varlen_backward(*views[:3], out, lse, views[3], bounds, m, m, causal=causal, scale=D ** -0.5)
        fns[kind] = fn
        grads[kind] = fn()
    torch.cuda.synchronize()
    check = {kind: [rel(a, b) for a, b in zip(grads[kind], grads["pair"])] for kind in grads}
    flops = 2.5 * 4 * H * sum(n * n for n in lengths) * D / (2 if causal else 1)
    run(f"varlen {len(lengths)} seqs {min(lengths)}-{m} H={H}/{HKV} D={D} {'causal' if causal else 'non-causal'}", fns, flops, check)
    launcher.backward_entry_for = backward_entry_for


def wide(B, H, N, DQK, DV, causal, kinds):
    """D_qk=160 or 192 (DeepSeek's MLA prefill: 192/128): "pad MxN" / "split MxN" run
    "dkdv_dq" on those tiles with Q's and K's columns padded to 256 or split 128 + 32/64."""
    from cutile_fmha.platforms import TileShape
    from cutile_fmha.platforms.backward import BackwardLaunch
    g = torch.Generator(device="cuda").manual_seed(N + H + DQK + DV)
    q, k = (torch.randn(B, H, N, DQK, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    v, do = (torch.randn(B, H, N, DV, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal)
    fns, grads = {}, {}
    for kind in kinds:
        if kind == "cudnn":
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            fns[kind] = lambda o=o, qg=qg, kg=kg, vg=vg: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
        else:
            entry = {"ours": BASE, "pair": PAIR}.get(kind)
            if entry is None:
                how, tiles = kind.split()
                launch = BackwardLaunch(TileShape(*map(int, tiles.split("x"))), 8,
                                        split_head_dims=frozenset({192}) if how == "split" else frozenset())
                entry = dataclasses.replace(BASE, launches=dict(BASE.launches) | {256: BASE.launches[256] | {"dkdv_dq": launch}},
                                            **({"exact_launches": {}} if hasattr(BASE, "exact_launches") else {}))
            fns[kind] = lambda entry=entry: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry)
        grads[kind] = fns[kind]()
    torch.cuda.synchronize()
    check = {kind: [rel(a, b) for a, b in zip(grads[kind], grads["pair"])] for kind in grads if kind != "cudnn"}
    run(f"B={B} H={H} N={N} D={DQK}/{DV} {'causal' if causal else 'non-causal'}", fns,
        2.5 * 2 * B * H * N * N * (DQK + DV) / (2 if causal else 1), check)


parts = sys.argv[1:] or ["grid", "d128", "threshold", "variants", "varlen"]
print(json.dumps({"gpu": torch.cuda.get_device_name(), "sms": device_facts(torch.device("cuda"))[1],
                  "entry": str(BASE.launches)}), flush=True)
if "grid" in parts:
    for D, H in ((64, 32), (256, 16)):
        for N in (4096, 8192, 16384):
            for causal in (True, False):
                dense(4, H, H, N, D, causal, ("ours", "old", "cudnn"))
if "d128" in parts:
    for N in (4096, 8192):
        for causal in (True, False):
            dense(4, 32, 32, N, 128, causal, ("ours", "old", "cudnn"))
    dense(4, 16, 4, 2048, 128, True, ("ours", "old", "cudnn"))
if "threshold" in parts:
    for B, H, HKV, N in ((1, 8, 8, 4096), (1, 16, 16, 4096), (2, 16, 16, 4096), (1, 32, 32, 8192),
                         (4, 16, 4, 2048), (2, 32, 8, 4096), (8, 32, 8, 2048)):
        dense(B, H, HKV, N, 64, True, ("fused", "pair", "cudnn"))
    for B, H, HKV, N in ((1, 8, 8, 2048), (1, 16, 16, 2048), (1, 16, 16, 4096), (2, 16, 4, 4096)):
        dense(B, H, HKV, N, 256, True, ("fused", "pair", "cudnn"))
if "variants" in parts:
    for var in (Variants(softcap=30.0), Variants(window=(1024, None))):
        for D, H in ((64, 32), (256, 16)):
            dense(4, H, H, 8192, D, True, ("fused", "pair"), variants=var)
if "tiles" in parts:
    for causal in (True, False):
        dense(4, 32, 32, 8192, 64, causal, ("fused 128x128", "fused 64x128", "fused 128x64", "pair"), variants=Variants(softcap=30.0))
    for N in (4096, 8192):
        for causal in (True, False):
            dense(4, 32, 32, N, 128, causal, ("fused 64x128", "fused 32x128", "pair", "cudnn"))
    dense(4, 16, 4, 2048, 128, True, ("fused 64x128", "fused 32x128", "pair", "cudnn"))
    dense(4, 32, 32, 8192, 128, True, ("fused 64x128", "fused 32x128", "pair"), variants=Variants(softcap=30.0))
if "threshold128" in parts:
    for B, H, HKV, N in ((2, 32, 8, 4096), (8, 16, 4, 2048), (1, 32, 32, 4096), (4, 32, 8, 4096),
                         (2, 32, 32, 4096)):
        dense(B, H, HKV, N, 128, True, ("fused 64x128", "pair", "cudnn"))
if "softcap128" in parts:
    cap = Variants(softcap=30.0)
    for B, H, HKV, N, causal in ((4, 32, 32, 4096, True), (4, 32, 32, 4096, False), (4, 32, 8, 4096, True),
                                 (4, 32, 8, 4096, False), (4, 32, 8, 8192, True), (4, 16, 4, 2048, True)):
        dense(B, H, HKV, N, 128, causal, ("fused 64x128", "pair"), variants=cap)
    for B, H, HKV, N, causal in ((4, 32, 8, 8192, True), (4, 32, 32, 8192, True)):
        dense(B, H, HKV, N, 128, causal, ("fused 64x128", "pair"), variants=Variants(window=(4096, None)))
if "d96" in parts:
    for causal in (True, False):
        dense(4, 32, 32, 8192, 96, causal, ("fused 64x128", "fused 32x128", "pair", "cudnn"))
    dense(4, 32, 8, 4096, 96, True, ("fused 64x128", "pair", "cudnn"))
if "rule128" in parts:
    for causal in (True, False):
        dense(4, 32, 32, 8192, 80, causal, ("fused 64x128", "pair", "cudnn"))
    dense(4, 32, 32, 8192, 96, True, ("fused 64x128", "pair"), variants=Variants(softcap=30.0))
    dense(4, 32, 8, 8192, 128, True, ("fused 64x128", "pair"), variants=Variants(window=(4096, None), softcap=30.0))
    dense(4, 32, 8, 8192, 96, True, ("fused 64x128", "pair"), variants=Variants(window=(1024, None)))
if "mla" in parts:  # before the split: "ours" padded 192 on 64x64 tiles
    for causal in (True, False):
        wide(4, 32, 8192, 192, 128, causal, ("ours", "pad 128x64", "split 64x64", "split 128x64", "split 32x128", "pair", "cudnn"))
    wide(2, 16, 4096, 192, 128, True, ("ours", "pad 128x64", "split 64x64", "split 128x64", "split 32x128", "pair", "cudnn"))
if "wide" in parts:  # after it: "ours" splits 160 and 192 on 64x64 tiles
    for DQK, DV in ((192, 128), (192, 192), (160, 160)):
        for causal in (True, False):
            wide(4, 32, 8192, DQK, DV, causal, ("ours", "pad 64x64", "pair", "cudnn")
                 + (("split 32x128",) if DV == 128 else ()))
    wide(2, 16, 4096, 192, 128, True, ("ours", "pad 64x64", "pair", "cudnn"))
if "mla32" in parts:  # after 192/128's own launch: "ours" splits it on 32x128 tiles
    for causal in (True, False):
        wide(4, 32, 8192, 192, 128, causal, ("ours", "split 64x64", "pair", "cudnn"))
    wide(2, 16, 4096, 192, 128, True, ("ours", "split 64x64", "pair", "cudnn"))
    wide(1, 16, 16384, 192, 128, True, ("ours", "split 64x64", "pair", "cudnn"))
if "varlen" in parts:
    for lengths in ([2048] * 16, [4096, 512, 3000, 1000, 8192, 700, 2500, 4096]):
        for causal in (True, False):
            varlen(lengths, 32, 8, 64, causal)
