"""Whether the forward's TFLOPS at long N fall with the time the GPU has been busy rather
than with N: the 32k x 32k forward without the causal mask (B=1, H=32, D=128, bf16) run
back to back for about 1.5 s, each call timed with its own CUDA events, after the GPU
idled for 2 s. Prints the TFLOPS of the calls in groups of 5. Run it with
`nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 50`
logging beside it to see the clocks."""

import time

import torch

from cutile_fmha import attention_with_lse

q, k, v = (torch.randn(1, 32, 32768, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
flops = 4 * 32 * 32768 * 32768 * 128
attention_with_lse(q, k, v)
torch.cuda.synchronize()
time.sleep(2)
calls = 50
events = [torch.cuda.Event(enable_timing=True) for _ in range(calls + 1)]
events[0].record()
for i in range(calls):
    attention_with_lse(q, k, v)
    events[i + 1].record()
torch.cuda.synchronize()
times = [events[i].elapsed_time(events[i + 1]) for i in range(calls)]
for start in range(0, calls, 5):
    group = times[start:start + 5]
    elapsed = sum(times[:start + 5])
    print(f"calls {start + 1}-{start + 5} (GPU busy {elapsed:.0f} ms by their end): "
          f"{flops * len(group) / sum(group) / 1e9:.0f} TFLOPS", flush=True)
