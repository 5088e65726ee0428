"""The Python checks of attention() on CPU tensors, old (af7ca22) and new, in one process:
_check + _check_variants + needs_grad with the default arguments; us per call, 7 rounds."""
import statistics, timeit, torch
import cutile_fmha.dropin as new
import cutile_fmha_old.dropin as old
q = torch.randn(1, 32, 4, 128, dtype=torch.bfloat16); k = torch.randn(1, 8, 512, 128, dtype=torch.bfloat16)
def checks(m):
    m._check(q, k, k, None, 0.0, False, None, True)
    m._check_variants(q, (-1, -1), None, None)
    m.needs_grad(q, k, k, None)
res = {"old": [], "new": []}
for _ in range(7):
    for name, m in (("old", old), ("new", new)):
        res[name].append(min(timeit.repeat(lambda: checks(m), number=20000, repeat=3)) / 20000 * 1e6)
for name, v in res.items():
    print(f"{name}: median {statistics.median(v):.2f} us (min {min(v):.2f}, max {max(v):.2f})")
