"""Kernels to read with Nsight Compute: our forward and backward, cuDNN's (SDPA) and
FlashAttention-4's where importable, B=4 H=32 N=4096 D=128 bf16, causal (forward and
backward) and non-causal (forward). Run under
    ncu --profile-from-start off --set full --clock-control none -o rep python3 ncu_profile.py
Everything is run twice before the profiled range (compilation, cuDNN's plan); the range is
cudaProfilerStart/Stop, not NVTX, since autograd launches the backward from its own thread."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha import attention

B, H, N, D = 4, 32, 4096, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, grad = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
                 for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
try:
    import flash_attn.cute as fa4
    fq, fk, fv = (t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v))
    fgrad = grad.transpose(1, 2).contiguous()
except Exception as error:
    print("FA4 not importable:", type(error).__name__)
    fa4 = None


def ours(causal):
    return attention(q, k, v, is_causal=causal)


def cudnn(causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def flash4(causal):
    return fa4.flash_attn_func(fq, fk, fv, causal=causal)[0]


methods = {"ours": ours, "cudnn": cudnn} | ({"fa4": flash4} if fa4 else {})


def run(name, causal, backward):
    out = methods[name](causal)
    if backward:
        out.backward(fgrad if name == "fa4" else grad)


cases = [(name, True, True) for name in methods] + [(name, False, False) for name in methods]
for case in cases:  # warm-up: compilation and plans outside the profiled range
    run(*case)
    run(*case)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for case in cases:
    print("profiled:", *case)
    run(*case)
    torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("done")
