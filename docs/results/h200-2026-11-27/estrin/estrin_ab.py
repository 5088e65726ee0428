"""Step 9's bf16 forward, causal, D=128, with 1 in 16 of its unmasked tiles' exponentials on
the FMA pipes: the quadratic (relative error 1.73e-3), the cubic by Horner's rule (7.5e-5,
three dependent FMAs) and the same cubic by Estrin's scheme (two dependent FMAs, one more
multiply), against the committed kernel, in one process: B=4, H=32, N 4096/8192/16384, CUDA
graphs, 7 rotating rounds. Accuracy first, against float64."""
import statistics, torch, importlib
import triton.testing
dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
K = {n: importlib.import_module(m) for n, m in (
    ("committed", "cutile_fmha_old"), ("quadratic", "cutile_fmha_q16"),
    ("cubic Horner", "cutile_fmha_c16"), ("cubic Estrin", "cutile_fmha_e16"))}
for dtype in (torch.bfloat16, torch.float16):
    for n in (1000, 2000):
        g = torch.Generator(device=dev).manual_seed(n)
        q, k, v = (torch.randn(1, 8, n, 128, device=dev, dtype=dtype, generator=g) * s for s in (3, 3, 1))
        s = (q.double() @ k.double().transpose(-1, -2)) / 128 ** 0.5
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=dev).triu(1), float("-inf"))
        ref = torch.softmax(s, -1) @ v.double()
        line = []
        for name, m in K.items():
            out = m.attention(q, k, v, is_causal=True).double()
            err = out - ref
            line.append(f"{name} max {err.abs().max().item():.3e} rms {err.pow(2).mean().sqrt().item():.4e}")
        print(f"accuracy {dtype} N={n}: " + "; ".join(line), flush=True)
for n in (4096, 8192, 16384):
    g = torch.Generator(device=dev).manual_seed(7)
    q, k, v = (torch.randn(4, 32, n, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    fns = {name: (lambda m=m: m.attention(q, k, v, is_causal=True)) for name, m in K.items()}
    for f in fns.values(): f()
    times = {name: [] for name in fns}; names = list(fns)
    for r in range(7):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=40))
    med = {name: statistics.median(t) for name, t in times.items()}
    flops = 4 * 4 * 32 * n * n * 128 / 2
    print(f"N={n} causal: " + ", ".join(f"{name} {med[name]:.3f} ms ({flops / med[name] / 1e9:.0f} TFLOPS, rounds {min(times[name]):.3f}-{max(times[name]):.3f}, committed over it {med['committed'] / med[name]:.3f})" for name in names), flush=True)
