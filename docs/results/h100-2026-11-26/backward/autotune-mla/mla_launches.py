"""D_qk=192, D_v=128 (DeepSeek's MLA prefill) backward: "dkdv_dq" launches against the
table's and cuDNN, bf16, ours in CUDA graphs, cuDNN eager (as the backward benchmark times
it), rotating rounds. Launches: TILE_M x TILE_N / worker warps on the command line, e.g.
    python mla_launches.py 32x128/8 16x128/8 64x64/8
the first is the reference the others' gradients are compared with."""
import statistics
import sys

import torch
import triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel

from cutile_fmha import attention_with_lse
from cutile_fmha.platforms import TileShape
from cutile_fmha.platforms.backward import BackwardLaunch, backward_entry_for, with_launches
from cutile_fmha.steps.backward import attention_backward

ROUNDS = 5
SHAPES = ((4, 32, 8192, True), (2, 16, 4096, True), (1, 16, 16384, True), (4, 16, 8192, False))


def entry_of(text):
    tiles, warps = text.split("/")
    launch = BackwardLaunch(TileShape(*map(int, tiles.split("x"))),
                            None if warps == "None" else int(warps))
    return with_launches(backward_entry_for("sm_90"), {((192, 128), "dkdv_dq"): launch}, text)


entries = {text: entry_of(text) for text in sys.argv[1:]}
print(torch.cuda.get_device_name(), flush=True)
for B, H, N, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(N + H)
    q, k = (torch.randn(B, H, N, 192, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(2))
    v, do = (torch.randn(B, H, N, 128, device="cuda", dtype=torch.bfloat16, generator=g)
             for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
    fns = {name: (lambda e=e: attention_backward(q, k, v, out, lse, do, causal=causal, entry=e))
           for name, e in entries.items()}
    fns["cudnn"] = lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)
    grads = {name: [t.float() for t in fn()] for name, fn in fns.items()}
    first = grads[next(iter(entries))]
    for name, g_ in grads.items():
        err = [float((x - y).abs().max() / y.abs().max()) for x, y in zip(g_, first)]
        print(f"  {name}: rel. max difference from {next(iter(entries))} dq dk dv "
              f"{[f'{e:.1e}' for e in err]}", flush=True)
    del grads, first
    times = {name: [] for name in fns}
    for r in range(ROUNDS):
        order = list(fns)[r % len(fns):] + list(fns)[:r % len(fns)]
        for name in order:
            bench = tt.do_bench if name == "cudnn" else tt.do_bench_cudagraph
            times[name].append(bench(fns[name], rep=120))
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"B={B} H={H} N={N} 192/128 {'causal' if causal else 'non-causal'}: " + "; ".join(
        f"{name} {med[name]:.3f} ms (speed / cuDNN {med['cudnn'] / med[name]:.3f}, rounds "
        f"{min(times[name]):.3f}-{max(times[name]):.3f})" for name in fns), flush=True)
