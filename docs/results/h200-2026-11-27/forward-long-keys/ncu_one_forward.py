"""One forward without the causal mask at B=1, H=32, D=128, bf16, q_len x k_len from the
command line, for ncu to profile."""

import sys

import torch

from cutile_fmha import attention_with_lse

q_len, k_len = int(sys.argv[1]), int(sys.argv[2])
q = torch.randn(1, 32, q_len, 128, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(1, 32, k_len, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
attention_with_lse(q, k, v)
torch.cuda.synchronize()
