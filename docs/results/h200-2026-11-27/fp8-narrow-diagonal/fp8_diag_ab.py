"""The FP8 forward under the causal mask with the diagonal in 128-key tiles (cutile_fmha: the
wide 256-key tiles below the diagonal, then 128-key ones up to it unmasked, then the masked
128-key ones) against the committed kernel (cutile_fmha_old: 256-key tiles throughout) and our
bf16 forward, in one process: B=4, H=32 (16 at D=256), bf16 inputs quantized per head with
to_fp8, CUDA graphs, 5 rotating rounds. Accuracy first, against float64 on the dequantized
float8 inputs."""
import statistics, torch
import triton.testing
import cutile_fmha_old as old
import cutile_fmha as new

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
KERNELS = {"committed": old, "narrow diagonal": new}


def reference(q, k, v):
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    n, m = s.shape[-2:]
    s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v.double()


def quantized(q, k, v):
    (q8, qd), (k8, kd) = old.to_fp8(q), old.to_fp8(k)
    v8t, vd = old.to_fp8(v, transpose=True)
    return q8, k8, v8t, qd, kd, vd


for D in (64, 128, 256):
    for n in (1, 127, 128, 129, 255, 256, 383, 1000, 1537):
        g = torch.Generator(device=dev).manual_seed(n + D)
        q, k, v = (torch.randn(1, 4, n, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        q8, k8, v8t, qd, kd, vd = quantized(q, k, v)
        deq = [x.float() * d[:, :, None, None] for x, d in ((q8, qd), (k8, kd))]
        vdq = (v8t[..., :n].float() * vd[:, :, None, None]).transpose(-1, -2)
        ref = reference(*deq, vdq)
        line, outs = [], {}
        for name, mod in KERNELS.items():
            out, lse = mod.attention_fp8(q8, k8, v8t, q_descale=qd, k_descale=kd, v_descale=vd,
                                         is_causal=True, return_lse=True)
            outs[name] = (out, lse)
            assert torch.isfinite(out).all() and torch.isfinite(lse).all()
            err = out.double() - ref
            line.append(f"{name}: max {err.abs().max().item() / ref.abs().max().item():.2e}"
                        f" rms {err.pow(2).mean().sqrt().item() / ref.pow(2).mean().sqrt().item():.2e}")
        dl = (outs["committed"][1] - outs["narrow diagonal"][1]).abs().max().item()
        print(f"accuracy D={D} N={n}: " + "; ".join(line) + f"; |lse new - old| {dl:.1e}", flush=True)

ROUNDS = 5
for D, ns in ((128, (4096, 8192, 16384)), (64, (4096, 8192, 16384)), (256, (4096,))):
    H = 32 if D < 256 else 16
    for n in ns:
        causal = True
        g = torch.Generator(device=dev).manual_seed(7)
        q, k, v = (torch.randn(4, H, n, D, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
        q8, k8, v8t, qd, kd, vd = quantized(q, k, v)
        fns = {"bf16 ours": lambda: old.attention(q, k, v, is_causal=causal)}
        for name, mod in KERNELS.items():
            fns[name] = lambda mod=mod: mod.attention_fp8(
                q8, k8, v8t, q_descale=qd, k_descale=kd, v_descale=vd, is_causal=causal)
        for f in fns.values():
            f()
        times = {name: [] for name in fns}
        names = list(fns)
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=40))
        flops = 4 * 4 * H * n * n * D / 2
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"D={D} N={n} causal: " + ", ".join(
            f"{name} {med[name]:.3f} ms ({flops / med[name] / 1e9:.0f} TFLOPS, "
            f"rounds {min(times[name]):.3f}-{max(times[name]):.3f})" for name in names)
            + "; over bf16: " + ", ".join(f"{name} {med['bf16 ours'] / med[name]:.3f}" for name in KERNELS)
            + "; new over committed time: " + " ".join(
                f"{a / b:.3f}" for a, b in zip(times["narrow diagonal"], times["committed"]))
            + f" (median {med['narrow diagonal'] / med['committed']:.3f})", flush=True)
