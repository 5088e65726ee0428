"""The backward at D=128 without variants: the one kernel ("dkdv_dq", dQ added atomically,
64x128 tiles, eight worker warps) forced for every call against the two kernels, with
cuDNN beside, over shapes without and with grouped heads; and D_qk=192 / D_v=128 on
candidate "dkdv_dq" tiles (columns split 128 + 64) against the table's exact launch.
Rotating rounds, ours in CUDA graphs, cuDNN eager (as the backward benchmark times it).
One JSON line per shape. Parts: d128, fp16, mla."""
import dataclasses, json, statistics, sys
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.platforms import TileShape
from cutile_fmha.platforms.backward import BackwardLaunch, backward_entry_for
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.steps.launcher import device_facts

ROUNDS = 3
BASE = backward_entry_for(device_facts(torch.device("cuda"))[0])
PAIR = dataclasses.replace(BASE, launches={d: {n: k[n] for n in ("dkdv", "dq")}
                                           for d, k in BASE.launches.items()}, exact_launches={})


def one_kernel(head_dim, tiles, warps=8, split=frozenset()):
    launch = BackwardLaunch(TileShape(*tiles), warps, split_head_dims=split)
    return dataclasses.replace(BASE, launches=dict(BASE.launches) | {
        head_dim: BASE.launches[head_dim] | {"dkdv_dq": launch}}, exact_launches={})


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def run(label, fns, flops, check):
    res = {n: [] for n in fns}
    for r in range(ROUNDS):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=100))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(json.dumps({"shape": label, "ms": med, "tflops": {n: flops / m / 1e9 for n, m in med.items()},
                      "speed_over_cudnn": {n: med["cudnn"] / m for n, m in med.items()},
                      "rounds": res, "check": check}), flush=True)


def case(B, H, HKV, N, DQK, DV, causal, entries, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(N + DQK + H + HKV)
    q = torch.randn(B, H, N, DQK, device="cuda", dtype=dtype, generator=g)
    do = torch.randn(B, H, N, DV, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(B, HKV, N, DQK, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(B, HKV, N, DV, device="cuda", dtype=dtype, generator=g)
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=HKV != H)
    fns = {"cudnn": lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)}
    for name, entry in entries.items():
        fns[name] = lambda entry=entry: attention_backward(q, k, v, out, lse, do, causal=causal, entry=entry)
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    ref = grads["pair"]
    check = {n: [rel(a, b) for a, b in zip(grads[n], ref)] for n in grads}
    flops = 2.5 * 2 * B * H * N * N * (DQK + DV) / (2 if causal else 1)
    run(f"B={B} H={H}/{HKV} N={N} D={DQK}/{DV} {'causal' if causal else 'non-causal'} {str(dtype)[6:]}",
        fns, flops, check)


parts = sys.argv[1:] or ["d128", "fp16"]
print(json.dumps({"gpu": torch.cuda.get_device_name(), "entry": str(BASE.launches[128])}), flush=True)
ONE = one_kernel(128, (64, 128))
if "d128" in parts:
    for B, H, HKV, N in ((4, 32, 32, 1024), (4, 16, 16, 2048), (8, 32, 32, 2048), (1, 32, 32, 4096),
                         (4, 32, 32, 4096), (2, 32, 32, 8192), (1, 32, 32, 16384),
                         (4, 32, 16, 4096), (4, 16, 4, 2048)):
        for causal in (True, False):
            case(B, H, HKV, N, 128, 128, causal, {"pair": PAIR, "one": ONE})
if "fp16" in parts:
    for B, H, HKV, N in ((4, 32, 32, 4096), (4, 16, 4, 2048)):
        for causal in (True, False):
            case(B, H, HKV, N, 128, 128, causal, {"pair": PAIR, "one": ONE}, torch.float16)
if "mla" in parts:
    split = frozenset({192})
    mla = {"pair": PAIR, "table": BASE, "split 64x128": one_kernel(256, (64, 128), split=split),
           "split 32x64": one_kernel(256, (32, 64), split=split),
           "split 64x64": one_kernel(256, (64, 64), split=split)}
    for B, H, N in ((4, 16, 4096), (2, 16, 8192)):
        for causal in (True, False):
            case(B, H, H, N, 192, 128, causal, mla)
