"""At q_len > 1 on a dense cache (32/8 heads, D=128, bf16, causal at the last key): the
decode kernel (the table's launch) against the variable-length kernel on the cache
(attention_with_kvcache's route for other head dims). CUDA graphs, 3 rotating rounds;
outputs against each other and float64."""
import statistics, sys, torch
import triton.testing as tt
from cutile_fmha import attention_with_kvcache, kvcache
from cutile_fmha.steps.variants import NO_VARIANTS
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
PEAK = 4.8e12 if "H200" in torch.cuda.get_device_name() else 3.35e12
shapes = [(int(b), int(c)) for b, c in (x.split("x") for x in sys.argv[1].split(","))]
q_lens = [int(x) for x in sys.argv[2].split(",")]
for q_len in q_lens:
    for batch, cache in shapes:
        g = torch.Generator(device="cuda").manual_seed(batch + cache + q_len)
        q = torch.randn(batch, 32, q_len, 128, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(batch, 8, cache, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
        fns = {"decode": lambda: attention_with_kvcache(q, k, v, lens),
               "varlen": lambda: kvcache._through_varlen(q, k, v, lens, None, True, 128 ** -0.5,
                                                        False, NO_VARIANTS, None)[0]}
        a, b = fns["decode"]().float(), fns["varlen"]().float()
        d = (a - b).abs().max().item()
        assert d < 2e-2, d
        times = {n: [] for n in fns}; names = list(fns)
        for r in range(3):
            for n in names[r % 2:] + names[:r % 2]:
                times[n].append(tt.do_bench_cudagraph(fns[n], rep=50) * 1e3)
        med = {n: statistics.median(t) for n, t in times.items()}
        nbytes = 2 * batch * 8 * cache * 128 * 2
        print(f"q_len {q_len:2d} batch {batch:2d} x {cache:5d}: " + ", ".join(
            f"{n} {med[n]:8.1f} us ({100 * nbytes / med[n] / 1e-6 / PEAK:4.1f}%)" for n in names)
            + f"; varlen / decode {med['varlen'] / med['decode']:.3f}; max |decode - varlen| {d:.1e}", flush=True)
