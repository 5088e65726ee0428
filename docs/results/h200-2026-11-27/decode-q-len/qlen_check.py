"""ours against SDPA cuDNN (boolean mask at the last key) and flash (lower-right causal) at
q_len > 1 on a dense cache: the benchmark's comparison computes the same thing."""
import torch, torch.nn.functional as F
from cutile_fmha import attention_with_kvcache
from cutile_fmha.assets.fmha_decode_benchmark import sdpa_calls
for q_len in (2, 4, 8, 16):
    for cache in (1000, 4096):
        g = torch.Generator(device="cuda").manual_seed(q_len * cache)
        q = torch.randn(3, 32, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(3, 8, cache, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((3,), cache, dtype=torch.int32, device="cuda")
        ours = attention_with_kvcache(q, k, v, lens).float()
        s = (q.double() @ k.double().repeat_interleave(4, 1).transpose(-1, -2)) / 128 ** 0.5
        s = s.masked_fill(~torch.ones(q_len, cache, dtype=torch.bool, device="cuda").tril(cache - q_len), float("-inf"))
        ref = torch.softmax(s, -1) @ v.double().repeat_interleave(4, 1)
        line = [f"ours {(ours - ref).abs().max().item():.2e}"]
        for name, fn in sdpa_calls(q, k, v).items():
            line.append(f"{name} {(fn().double() - ref).abs().max().item():.2e}")
        print(f"q_len {q_len} cache {cache}: max |x - float64|: " + ", ".join(line), flush=True)
