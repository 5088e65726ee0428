"""The variants kernel with a softcap, 1 in 16 / 8 / 4 of its unmasked tiles' exponentials
on the FMA pipes (a cubic, relative error 7.5e-5), against the committed kernel and the
plain forward, one process, H200: accuracy against float64 (bf16 and fp16), then B=4, H=32,
D=128, N=8192, bf16, softcap 30, CUDA graphs, 5 rotating rounds."""
import statistics, torch, importlib
import triton.testing
dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
K = {n: importlib.import_module(m) for n, m in (("committed", "cutile_fmha_old"), ("1 in 16", "cutile_fmha_v16"), ("1 in 8", "cutile_fmha_v8"), ("1 in 4", "cutile_fmha_v4"))}
CAP = 30.0


def reference(q, k, v, causal):
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = CAP * torch.tanh(s / CAP)
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


for dtype in (torch.bfloat16, torch.float16):
    for causal in (False, True):
        g = torch.Generator(device=dev).manual_seed(3)
        q, k, v = (torch.randn(1, 8, 2000, 128, device=dev, dtype=dtype, generator=g) * s for s in (3, 3, 1))
        ref = reference(q, k, v, causal)
        line = []
        for name, m in K.items():
            e = m.attention(q, k, v, is_causal=causal, softcap=CAP).double() - ref
            line.append(f"{name}: max {e.abs().max().item():.3e} rms {e.pow(2).mean().sqrt().item():.4e}")
        print(f"accuracy {str(dtype)[6:]} causal={causal}: " + "; ".join(line), flush=True)
for n in (8192, 16384):
    for causal in (True, False):
        g = torch.Generator(device=dev).manual_seed(7)
        q, k, v = (torch.randn(4, 32, n, 128, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        fns = {"plain": lambda: K["committed"].attention(q, k, v, is_causal=causal)}
        fns |= {name: (lambda m=m: m.attention(q, k, v, is_causal=causal, softcap=CAP)) for name, m in K.items()}
        for f in fns.values(): f()
        times = {name: [] for name in fns}; names = list(fns)
        for r in range(5):
            for name in names[r % 5:] + names[:r % 5]:
                times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=40))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"N={n} causal={causal}: " + ", ".join(f"{name} {med[name]:.3f} ms (rounds {min(times[name]):.3f}-{max(times[name]):.3f}, over plain {med[name] / med['plain']:.3f})" for name in names), flush=True)
