"""The backward at smaller tiles with one warpgroup per CTA and two CTAs per SM (the
`occupancy` hint), so one CTA's softmax runs beside the other's matrix products, against
the table's launches (eight worker warps, one CTA per SM) and cuDNN. bf16, one process,
rotating rounds, ours in CUDA graphs, cuDNN eager. One JSON line per shape."""
import dataclasses, json, os, statistics, sys
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.platforms import TileShape
from cutile_fmha.platforms.backward import BackwardLaunch, backward_entry_for
from cutile_fmha.steps import backward as launcher
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.steps.launcher import device_facts, with_hints

ROUNDS = int(os.environ.get("ROUNDS", "3"))
BASE = backward_entry_for(device_facts(torch.device("cuda"))[0])
OCCUPANCY = {}  # launch name -> occupancy hint for the config being run
_plain = launcher.backward_kernel


def backward_kernel(name, num_worker_warps, module=launcher.kernels):
    kernel = _plain(name, num_worker_warps, module)
    occ = OCCUPANCY.get(name)
    return kernel if occ is None else with_hints(kernel, {"occupancy": occ} | (
        {"num_worker_warps": num_worker_warps} if num_worker_warps else {}))


launcher.backward_kernel = backward_kernel


def config(d, spec):
    """spec: "table", or "f MxN wW oO" (dkdv_dq for every call), or "p MxN wW oO [MxN wW oO]"
    (the two kernels: dK/dV's launch, then dQ's or the table's)."""
    if spec == "table":
        return BASE, {}
    kind, *parts = spec.split()
    launches, occ = dict(BASE.launches[d]), {}
    groups = [parts[i:i + 3] for i in range(0, len(parts), 3)]
    names = ["dkdv_dq"] if kind == "f" else ["dkdv", "dq"]
    for name, (tiles, w, o) in zip(names, groups):
        launches[name] = BackwardLaunch(TileShape(*map(int, tiles.split("x"))), int(w[1:]))
        occ[name] = int(o[1:])
    if kind == "p":
        launches.pop("dkdv_dq", None)
    entry = dataclasses.replace(BASE, launches=dict(BASE.launches) | {d: launches}, exact_launches={})
    return entry, occ


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def shape(B, H, HKV, N, D, causal, specs):
    g = torch.Generator(device="cuda").manual_seed(N + D + H + HKV)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    fns, grads = {}, {}
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HKV != H)
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    for spec in specs:
        entry, occ = config(D, spec)

        def fn(entry=entry, occ=occ):
            OCCUPANCY.clear(); OCCUPANCY.update(occ)
            return attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry)
        fns[spec] = fn
    for name, fn in fns.items():
        grads[name] = fn()
    torch.cuda.synchronize()
    check = {n: [round(rel(a, b), 5) for a, b in zip(grads[n], grads["cudnn"])] for n in grads}
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            if n == "cudnn":
                res[n].append(tt.do_bench(fns[n], rep=120))
            else:
                entry, occ = config(D, n)
                OCCUPANCY.clear(); OCCUPANCY.update(occ)
                res[n].append(tt.do_bench_cudagraph(fns[n], rep=120))
    med = {n: statistics.median(t) for n, t in res.items()}
    label = f"B={B} H={H}/{HKV} N={N} D={D} {'causal' if causal else 'non-causal'}"
    print(json.dumps({"shape": label, "ms": med, "over_table": {n: med[n] / med["table"] for n in med},
                      "cudnn_time_over_ours": {n: med["cudnn"] / m for n, m in med.items()},
                      "rel_err_vs_cudnn": check, "rounds": res}), flush=True)
    print(f"# {label}: " + "  ".join(f"{n}: {med[n]:.3f} ms ({med['cudnn'] / med[n]:.3f}x cuDNN)" for n in med),
          flush=True)


part = sys.argv[1] if len(sys.argv) > 1 else "d128"
print(json.dumps({"gpu": torch.cuda.get_device_name(), "part": part}), flush=True)
if part == "d128":
    specs = ["table", "f 64x64 w4 o1", "f 64x64 w4 o2", "f 32x64 w4 o2", "p 64x64 w4 o2 128x64 w8 o1"]
    for args in ((4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False), (4, 16, 4, 2048, 128, True),
                 (4, 32, 8, 4096, 128, True)):
        shape(*args, specs)
