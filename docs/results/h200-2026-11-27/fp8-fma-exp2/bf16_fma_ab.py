"""Step 9's bf16 forward with 1 in 16 / 1 in 8 of its unmasked tiles' exponentials on the
FMA pipes (the FP8 kernel's quadratic), against the committed kernel, H200, one process:
accuracy against float64, then B=4 H=32 D=128 N 8192/16384, CUDA graphs, 5 rotating rounds."""
import statistics, torch, importlib
import triton.testing
dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
K = {n: importlib.import_module(m) for n, m in (("committed", "cutile_fmha_old"), ("1 in 16", "cutile_fmha_b16"), ("1 in 8", "cutile_fmha_b8"))}
for causal in (False, True):
    g = torch.Generator(device=dev).manual_seed(3)
    q, k, v = (torch.randn(1, 8, 2000, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    line = []
    for name, m in K.items():
        e = (m.attention(q, k, v, is_causal=causal).double() - ref)
        line.append(f"{name}: max {e.abs().max().item():.3e} rms {e.pow(2).mean().sqrt().item():.3e}")
    print(f"accuracy causal={causal}: " + "; ".join(line), flush=True)
for n in (8192, 16384):
    for causal in (True, False):
        g = torch.Generator(device=dev).manual_seed(7)
        q, k, v = (torch.randn(4, 32, n, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        fns = {name: (lambda m=m: m.attention(q, k, v, is_causal=causal)) for name, m in K.items()}
        for f in fns.values(): f()
        times = {name: [] for name in fns}; names = list(fns)
        for r in range(5):
            for name in names[r % 3:] + names[:r % 3]:
                times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=40))
        med = {name: statistics.median(t) for name, t in times.items()}
        flops = 4 * 4 * 32 * n * n * 128 / (2 if causal else 1)
        print(f"N={n} causal={causal}: " + ", ".join(f"{name} {med[name]:.3f} ms ({flops / med[name] / 1e9:.0f} TFLOPS, rounds {min(times[name]):.3f}-{max(times[name]):.3f}, over committed {med['committed'] / med[name]:.3f})" for name in names), flush=True)
