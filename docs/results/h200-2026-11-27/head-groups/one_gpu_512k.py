"""One GPU at B=1, H=32, N=512k, D=128, bf16, causal: 2^31 elements per tensor, past cuTile's
32-bit strides whole, so attention() runs two groups of 16 heads. Checks the last 64 query
rows of heads 0, 15, 16 and 31 (those that see every key) against float64, then times the
forward and forward+backward with CUDA events against SDPA's cuDNN backend, in turns."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cutile_fmha import attention
from cutile_fmha.assets.measure import attention_flops

N, H, D = 2 ** 19, 32, 128
torch.manual_seed(0)
q, k, v, grad = (torch.randn(1, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
print(f"q: {tuple(q.shape)}, {q.numel()} elements (2^31 = {2 ** 31})", flush=True)


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def ours(q, k, v):
    return attention(q, k, v, is_causal=True)


def check(name, fn):
    with torch.no_grad():
        out = fn(q, k, v)
    torch.cuda.synchronize()
    rows = slice(N - 64, N)
    for head in (0, 15, 16, 31):
        qh, kh, vh = (t[0, head].double() for t in (q, k, v))
        scores = (qh[rows] @ kh.T) * D ** -0.5
        want = torch.softmax(scores, dim=-1) @ vh
        got = out[0, head, rows].double()
        print(f"{name}: head {head}, last 64 rows: max |out - float64| "
              f"{(got - want).abs().max().item():.3e}, finite {bool(got.isfinite().all())}",
              flush=True)
    del out


def timed(fn, backward: bool) -> float:
    leaves = [t.detach().requires_grad_(backward) for t in (q, k, v)]
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    out = fn(*leaves)
    if backward:
        out.backward(grad)
    end.record()
    torch.cuda.synchronize()
    del out, leaves
    return start.elapsed_time(end)


methods = {"ours": ours, "cudnn": cudnn}
for name, fn in methods.items():
    try:
        check(name, fn)
        timed(fn, True)  # warm-up
    except Exception as error:  # report and go on with the other method
        print(f"{name}: {type(error).__name__}: {str(error)[:300]}", flush=True)
        methods = {n: f for n, f in methods.items() if n != name}
    torch.cuda.empty_cache()
flops = attention_flops(1, H, N, N, D, True)
for round_ in range(2):
    for name, fn in (list(methods.items())[::-1] if round_ else methods.items()):
        torch.cuda.reset_peak_memory_stats()
        fwd = timed(fn, False)
        both = timed(fn, True)
        peak = torch.cuda.max_memory_allocated() / 2 ** 30
        print(f"round {round_} {name}: fwd {fwd:.1f} ms ({flops / fwd / 1e9:.0f} TFLOPS), "
              f"fwd+bwd {both:.1f} ms ({3.5 * flops / both / 1e9:.0f} TFLOPS), "
              f"peak {peak:.1f} GiB", flush=True)
