"""Host time per call of attention_varlen / attention_with_kvcache, whole and by part."""
import time, cProfile, pstats, io, statistics
import torch, cuda.tile as ct
from cutile_fmha import attention, attention_varlen, attention_with_kvcache
import cutile_fmha.steps.varlen as sv, cutile_fmha.steps.decode as sd

def per_call_us(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return min(best)

dev = "cuda"; dt = torch.bfloat16
q4 = torch.randn(1, 32, 1, 128, device=dev, dtype=dt)
kc = torch.randn(1, 8, 512, 128, device=dev, dtype=dt); vc = torch.randn_like(kc)
lens = torch.full((1,), 512, dtype=torch.int32, device=dev)
qp = torch.randn(1, 32, 128, device=dev, dtype=dt)
kp = torch.randn(512, 8, 128, device=dev, dtype=dt); vp = torch.randn_like(kp)
cq = torch.tensor([0, 1], dtype=torch.int32, device=dev); ck = torch.tensor([0, 512], dtype=torch.int32, device=dev)
calls = {
  "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q4, kc, vc, enable_gqa=True),
  "attention": lambda: attention(q4, kc, vc, enable_gqa=True),
  "varlen": lambda: attention_varlen(qp, kp, vp, cq, ck, 1, 512),
  "kvcache": lambda: attention_with_kvcache(q4, kc, vc, lens),
  "empty_like": lambda: torch.empty_like(q4),
}
for name, fn in calls.items():
    print(f"{name:12s} {per_call_us(fn):6.1f} us", flush=True)
# launch alone, by number of tensors
real_launch = ct.launch
captured = {}
def capture(stream, grid, kernel, args):
    captured.setdefault(kernel, (stream, grid, kernel, args))
    return real_launch(stream, grid, kernel, args)
class Shim:
    def __getattr__(self, n): return getattr(ct, n)
shim = Shim(); shim.launch = capture
sv.ct = shim; sd.ct = shim
calls["varlen"](); calls["kvcache"]()
for kernel, (stream, grid, k, a) in captured.items():
    tensors = sum(isinstance(x, torch.Tensor) for x in a)
    print(f"ct.launch alone ({tensors} tensors, {len(a)} args): "
          f"{per_call_us(lambda: real_launch(stream, grid, k, a)):6.1f} us", flush=True)
shim.launch = lambda *a: None
for name in ("varlen", "kvcache"):
    print(f"{name} without the launch: {per_call_us(calls[name]):6.1f} us", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(2000): calls[name]()
    pr.disable(); s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18); print(s.getvalue()[:4000])
