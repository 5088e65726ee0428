"""One backward with the one-kernel launch ("dkdv_dq") at B=1, H=32, D=128, bf16,
non-causal, q_len x k_len from the command line, for ncu to profile its dK/dV kernel."""

import sys

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward

q_len, k_len = int(sys.argv[1]), int(sys.argv[2])
q, grad = (torch.randn(1, 32, q_len, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
k, v = (torch.randn(1, 32, k_len, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
out, lse = attention_with_lse(q, k, v)
attention_backward(q, k, v, out, lse, grad)
torch.cuda.synchronize()
