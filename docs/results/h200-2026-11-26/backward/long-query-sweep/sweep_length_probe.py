"""Why the one-kernel backward ("dkdv_dq") loses speed at long N without the mask: the same
FLOPs with the query sweep long and the key range short, and the other way round. Each
dK/dV CTA (128 keys) sweeps every query tile and adds its dQ tile to a float32 buffer of
q_len x D per head (64 MB at 128k queries, more than the L2): if that buffer leaving the
L2 is the cause, long query sweeps lose and long key ranges do not. B=1, H=32, D=128,
bf16, non-causal; the one kernel against the two kernels (forced with
torch.use_deterministic_algorithms), rotating rounds, CUDA events."""

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward

SHAPES = [(32768, 32768), (131072, 16384), (16384, 131072), (65536, 32768), (32768, 65536),
          (131072, 131072)]


def timed_ms(fn, iterations=2):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


for q_len, k_len in SHAPES:
    generator = torch.Generator(device="cuda").manual_seed(q_len + k_len)
    q, grad = (torch.randn(1, 32, q_len, 128, generator=generator, device="cuda",
                           dtype=torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(1, 32, k_len, 128, generator=generator, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    out, lse = attention_with_lse(q, k, v)

    def backward(two_kernels):
        torch.use_deterministic_algorithms(two_kernels, warn_only=True)
        try:
            return attention_backward(q, k, v, out, lse, grad)
        finally:
            torch.use_deterministic_algorithms(False)

    times = {False: [], True: []}
    for round_ in range(3):
        for two_kernels in ((False, True) if round_ % 2 == 0 else (True, False)):
            times[two_kernels].append(timed_ms(lambda: backward(two_kernels)))
    flops = 2.5 * 4 * 32 * q_len * k_len * 128
    one_ms, two_ms = (sorted(times[f])[1] for f in (False, True))
    print(f"q_len={q_len} k_len={k_len}: one kernel {one_ms:.2f} ms "
          f"({flops / one_ms / 1e9:.0f} TFLOPS; {', '.join(f'{t:.2f}' for t in times[False])}), "
          f"two kernels {two_ms:.2f} ms ({flops / two_ms / 1e9:.0f} TFLOPS; "
          f"{', '.join(f'{t:.2f}' for t in times[True])}), one / two {one_ms / two_ms:.3f}",
          flush=True)
    q = k = v = grad = out = lse = None  # before the next shape's tensors
    torch.cuda.empty_cache()
