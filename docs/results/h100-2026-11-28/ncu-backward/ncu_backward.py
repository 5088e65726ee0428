"""The backward alone under Nsight Compute: ours (at D=128 without grouped heads: row_dot,
the zeros, the one "dkdv_dq" kernel, the cast) and SDPA cuDNN's, B=4 H=32 N=4096 D=128 bf16,
causal and not. Run under
    ncu --profile-from-start off --set full --clock-control none -o rep python3 ncu_backward.py
Each forward runs before the profiled range, each backward twice before it (compilation,
cuDNN's plan); the range is cudaProfilerStart/Stop, around the backwards only."""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha import attention

B, H, N, D = 4, 32, 4096, 128
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, grad = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
                 for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))


def ours(causal):
    return attention(q, k, v, is_causal=causal)


def cudnn(causal):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


outs = {(f.__name__, causal): f(causal) for f in (ours, cudnn) for causal in (True, False)}
for out in outs.values():  # warm-up outside the profiled range
    for _ in range(2):
        out.backward(grad, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.profiler.start()
for (name, causal), out in outs.items():
    print("profiled:", name, "causal" if causal else "not causal", flush=True)
    out.backward(grad, retain_graph=True)
    torch.cuda.synchronize()
torch.cuda.profiler.stop()
print("done")
