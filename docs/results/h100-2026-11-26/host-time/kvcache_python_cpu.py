"""attention_with_kvcache's call path on CPU tensors, launches stubbed: us per call; cProfile."""
import timeit, statistics, torch, sys, cProfile, pstats
from cutile_fmha import kvcache as api
from cutile_fmha.steps import decode as sd
sd.ct.launch = lambda *a, **k: None
sd.current_stream = lambda d: 0
sd.device_facts = lambda d: ("sm_90", 132)
torch.cuda.get_device_capability = lambda d=None: (9, 0)
torch.cuda.is_current_stream_capturing = lambda: False
api._check_devices = lambda *a, **k: None
import cutile_fmha.steps.launcher as L; L._check_devices = lambda *a, **k: None
q_len = int(sys.argv[1]) if len(sys.argv) > 1 else 1
q = torch.randn(1, 32, q_len, 128, dtype=torch.bfloat16); k = torch.randn(1, 8, 512, 128, dtype=torch.bfloat16)
sl = torch.tensor([512], dtype=torch.int32)
f = lambda: api.attention_with_kvcache(q, k, k, sl)
f()
res = [min(timeit.repeat(f, number=20000, repeat=3)) / 20000 * 1e6 for _ in range(5)]
print(f"attention_with_kvcache python (q_len {q_len}): median {statistics.median(res):.2f} us, min {min(res):.2f}")
pr = cProfile.Profile(); pr.enable()
for _ in range(20000): f()
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(14)
