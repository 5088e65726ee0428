"""The forward without the causal mask at long N, one launch against the keys in chunks
(one launch per chunk of `chunk` keys, the partial outputs merged by their LSEs in float32,
as the ring does), on one GPU: B=1, H=32, D=128, bf16, rotating rounds, CUDA events.
Prints each shape's times, TFLOPS and the largest difference of the outputs.
Run: python key_chunks_probe.py"""

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.distributed import merge_partials

SHAPES = [(32768, 32768), (65536, 65536), (131072, 131072), (16384, 131072)]  # (q_len, k_len)
CHUNKS = [16384, 32768]


def one_launch(q, k, v):
    return attention_with_lse(q, k, v)[0]


def in_chunks(q, k, v, chunk):
    out = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
    lse = torch.full(q.shape[:-1], float("-inf"), device=q.device, dtype=torch.float32)
    for start in range(0, k.shape[2], chunk):
        block_out, block_lse = attention_with_lse(q, k[:, :, start:start + chunk],
                                                  v[:, :, start:start + chunk])
        merge_partials(out, lse, block_out, block_lse)
    return out.to(q.dtype)


def timed_ms(fn, iterations=2):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iterations


for q_len, k_len in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(1, 32, q_len, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 32, k_len, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    reference = one_launch(q, k, v).float()
    methods = {"one launch": lambda: one_launch(q, k, v)}
    for chunk in CHUNKS:
        if chunk < k_len:
            methods[f"chunks of {chunk}"] = lambda chunk=chunk: in_chunks(q, k, v, chunk)
    for name, fn in methods.items():
        diff = (fn().float() - reference).abs().max().item()
        print(f"{q_len}x{k_len} {name}: max |difference| to one launch {diff:.3g}", flush=True)
    times = {name: [] for name in methods}
    for _ in range(3):  # rotating rounds
        for name, fn in methods.items():
            times[name].append(timed_ms(fn))
    flops = 4 * 32 * q_len * k_len * 128
    base = min(times["one launch"])
    for name, values in times.items():
        best = min(values)
        print(f"{q_len}x{k_len} {name}: {best:.2f} ms (rounds {', '.join(f'{t:.2f}' for t in values)}), "
              f"{flops / best / 1e9:.0f} TFLOPS, time vs one launch {best / base:.3f}", flush=True)
    del q, k, v, reference
    torch.cuda.empty_cache()
