"""Kernel times inside one backward (torch.profiler), bf16, D=128: which share the small
kernels (Delta, the float32 dQ's zeroing and cast) take beside the gradient kernels."""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from cutile_fmha import attention

SHAPES = [  # B, H, H_kv, N, causal
    (4, 16, 4, 2048, True),   # the Llama demo's: two kernels
    (4, 32, 8, 4096, True),   # grouped causal: two kernels
    (4, 32, 32, 4096, True),  # one kernel
    (4, 32, 32, 4096, False),  # one kernel
]


def main():
    for b, h, hkv, n, causal in SHAPES:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(b, hkv, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        for t in (q, k, v):
            t.requires_grad_(True)
        out = attention(q, k, v, is_causal=causal, enable_gqa=hkv != h)
        grad = torch.randn_like(out)
        for _ in range(3):
            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
        torch.cuda.synchronize()
        reps = 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
            torch.cuda.synchronize()
        totals = collections.Counter()
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                totals[event.name[:60]] += event.device_time / reps
        whole = sum(totals.values())
        print(f"B={b} H={h}/{hkv} N={n} causal={causal}: kernels {whole:.1f} us a backward")
        for name, us in totals.most_common():
            print(f"  {us:9.1f} us {100 * us / whole:5.1f}%  {name}")
        sys.stdout.flush()


main()
