"""D_qk=192, D_v=128 (DeepSeek's MLA prefill) backward, causal, the package as it is against
cuDNN: ours through attention_backward in CUDA graphs, cuDNN eager (as the backward
benchmark times it); bf16, rotating rounds."""
import statistics
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward

print(torch.cuda.get_device_name(), flush=True)
for B, H, N in ((4, 32, 8192), (2, 16, 4096), (1, 16, 16384)):
    g = torch.Generator(device="cuda").manual_seed(N + H)
    q, k = (torch.randn(B, H, N, 192, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    v, do = (torch.randn(B, H, N, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=True)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True)
    fns = {"ours": lambda: attention_backward(q, k, v, out, lse, do, causal=True),
           "cudnn": lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)}
    a, b = fns["ours"](), fns["cudnn"]()
    err = [float((x.float() - y.float()).abs().max() / y.float().abs().max()) for x, y in zip(a, b)]
    res = {n: [] for n in fns}
    for r in range(5):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=120))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(f"B={B} H={H} N={N} 192/128 causal: ours {med['ours']:.3f} ms, cuDNN {med['cudnn']:.3f} ms, "
          f"speed / cuDNN {med['cudnn'] / med['ours']:.3f}; rounds {[round(x, 3) for x in res['ours']]} / "
          f"{[round(x, 3) for x in res['cudnn']]}; rel err vs cuDNN dq dk dv {[round(e, 4) for e in err]}", flush=True)
