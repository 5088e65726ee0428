"""Step 9's 16-bit forward with 1 in 16 / 1 in 8 of its unmasked tiles' exponentials on the
FMA pipes as a cubic (relative error 7.5e-5), against the committed kernel, one process:
accuracy against float64 (bf16 and fp16), then B=4, H=32 (16 at D=256), N=8192 (and 16384
at D=128), bf16, CUDA graphs, 5 rotating rounds."""
import statistics, torch, importlib
import triton.testing
dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
K = {n: importlib.import_module(m) for n, m in (("committed", "cutile_fmha_old"), ("1 in 16", "cutile_fmha_c16"), ("1 in 8", "cutile_fmha_c8"))}
for dtype in (torch.bfloat16, torch.float16):
    for D in (64, 128, 256):
        for causal in (False, True):
            g = torch.Generator(device=dev).manual_seed(3)
            q, k, v = (torch.randn(1, 8, 2000, D, device=dev, dtype=dtype, generator=g) * s for s in (2, 2, 1))
            ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
            line = []
            for name, m in K.items():
                e = (m.attention(q, k, v, is_causal=causal).double() - ref)
                line.append(f"{name}: max {e.abs().max().item():.3e} rms {e.pow(2).mean().sqrt().item():.4e}")
            print(f"accuracy {str(dtype)[6:]} D={D} causal={causal}: " + "; ".join(line), flush=True)
for D, ns in ((128, (8192, 16384)), (64, (8192,)), (256, (8192,))):
    H = 16 if D == 256 else 32
    for n in ns:
        for causal in (True, False):
            g = torch.Generator(device=dev).manual_seed(7)
            q, k, v = (torch.randn(4, H, n, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
            fns = {name: (lambda m=m: m.attention(q, k, v, is_causal=causal)) for name, m in K.items()}
            for f in fns.values(): f()
            times = {name: [] for name in fns}; names = list(fns)
            for r in range(5):
                for name in names[r % 3:] + names[:r % 3]:
                    times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=40))
            med = {name: statistics.median(t) for name, t in times.items()}
            flops = 4 * 4 * H * n * n * D / (2 if causal else 1)
            print(f"D={D} N={n} causal={causal}: " + ", ".join(f"{name} {med[name]:.3f} ms ({flops / med[name] / 1e9:.0f} TFLOPS, rounds {min(times[name]):.3f}-{max(times[name]):.3f}, over committed {med['committed'] / med[name]:.3f})" for name in names), flush=True)
