"""The causal dK/dV kernel's CTA order: tile_major's groups of (head, batch) pairs hold as
many pairs as fit L2_GROUP_BYTES of the Q and dO they read (16 MB in the package). Copies
of dkdv with 32 MB, 64 MB and the whole grid as one group, against the package's, for the
two kernels ("pair") and the one kernel ("one", dQ added atomically, 64x128 tiles), causal,
D=128, bf16, with cuDNN beside. Rotating rounds, ours in CUDA graphs, cuDNN eager. One JSON
line per shape."""
import dataclasses, json, statistics, types
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.kernels import backward as kb, common
from cutile_fmha.platforms import TileShape
from cutile_fmha.platforms.backward import BackwardLaunch, backward_entry_for
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, launch_gradient_kernels, row_dot
from cutile_fmha.steps.launcher import device_facts
import cuda.tile as ct

ROUNDS = 3
BASE = backward_entry_for(device_facts(torch.device("cuda"))[0])
PAIR = dataclasses.replace(BASE, launches={d: {n: k[n] for n in ("dkdv", "dq")}
                                           for d, k in BASE.launches.items()}, exact_launches={})
ONE = dataclasses.replace(BASE, launches=dict(BASE.launches) | {128: BASE.launches[128] | {
    "dkdv_dq": BackwardLaunch(TileShape(64, 128), 8)}}, exact_launches={})


def copy_function(f, globals_):
    """f with other globals (its annotations, which mark its constants, kept)."""
    g = types.FunctionType(f.__code__, globals_, f.__name__, f.__defaults__, f.__closure__)
    g.__annotations__, g.__kwdefaults__ = dict(f.__annotations__), f.__kwdefaults__
    return g


def module_with_budget(budget):
    """A stand-in for cutile_fmha.kernels whose dkdv numbers its CTAs with `budget` bytes."""
    if budget is None:
        return kb
    tm_globals = dict(common.tile_major.__globals__, L2_GROUP_BYTES=budget)
    tile_major = copy_function(common.tile_major, tm_globals)
    dkdv_globals = dict(kb.dkdv._pyfunc.__globals__, tile_major=tile_major)
    dkdv = ct.kernel(copy_function(kb.dkdv._pyfunc, dkdv_globals))
    return types.SimpleNamespace(dkdv=dkdv, dq=kb.dq)


BUDGETS = {"16MB": None, "32MB": 32 << 20, "64MB": 64 << 20, "grid": (1 << 31) - 1}
MODULES = {name: module_with_budget(b) for name, b in BUDGETS.items()}


def backward(q, k, v, out, lse, do, entry, module):
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = {"Q": q, "K": k, "V": v, "dO": do, "Lse": lse, "Delta": row_dot(out, do),
               "dK": dk, "dV": dv, "dQ": dq, "qk_scale": q.shape[-1] ** -0.5, "query_offset": 0}
    launch_gradient_kernels(BACKWARD_FAMILIES, tensors, causal=True, entry=entry, module=module)
    return dq, dk, dv


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def case(B, H, HKV, N, D=128):
    g = torch.Generator(device="cuda").manual_seed(N + H + HKV)
    q, do = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=True, enable_gqa=HKV != H)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True, enable_gqa=HKV != H)
    fns = {"cudnn": lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)}
    for kind, entry in (("pair", PAIR), ("one", ONE)):
        for name, module in MODULES.items():
            fns[f"{kind} {name}"] = lambda entry=entry, module=module: backward(q, k, v, out, lse, do, entry, module)
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    check = {n: max(rel(a, b) for a, b in zip(grads[n], grads["pair 16MB"])) for n in grads}
    res = {n: [] for n in fns}
    for r in range(ROUNDS):
        names = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
        for n in names:
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=100))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(json.dumps({"shape": f"B={B} H={H}/{HKV} N={N} D={D} causal", "ms": med,
                      "over_pair_16MB": {n: m / med["pair 16MB"] for n, m in med.items()},
                      "speed_over_cudnn": {n: med["cudnn"] / m for n, m in med.items()},
                      "max_rel_diff_vs_pair_16MB": check}), flush=True)


print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
for shape in ((4, 16, 4, 2048), (2, 16, 4, 2048), (4, 32, 8, 4096), (2, 32, 8, 4096), (8, 16, 4, 4096),
              (4, 32, 8, 8192), (4, 16, 16, 2048), (4, 32, 32, 4096), (4, 32, 32, 8192), (1, 32, 32, 16384)):
    case(*shape)
