"""The FP8 forward with both its products accumulated by the tensor cores (ct.mma's
use_fast_acc; cutile_fmha) against the committed one (cutile_fmha_old, 6bba286: each float8
product added to the accumulator in registers) and the package with P V alone accumulated so
(cutile_fmha_pv), in one process. Accuracy first: each against float64 on the dequantized
float8 inputs. Then time: B=4, H=32 (16 at D=256), CUDA graphs, rotating rounds, our bf16
forward beside; at D=256 also 128x128 tiles, which spilled before and do not now."""
import dataclasses, statistics, sys, torch
import triton.testing
import cutile_fmha as new
import cutile_fmha_old as old
import cutile_fmha_pv as pv
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import TunedLaunch, TileShape
from cutile_fmha.steps.fp8 import fp8_forward

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
ENTRY = entry_for("sm_90")


def reference(q, k, v, causal, scale):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if causal:
        n, m = s.shape[-2:]
        s = s.masked_fill(torch.ones(n, m, dtype=torch.bool, device=dev).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ v.double(), lse


def launch(tm, tn, occ, d, causal):
    t = TunedLaunch(9, TileShape(tm, tn), occ, 8)
    return dataclasses.replace(ENTRY, fp8_tuned={**ENTRY.fp8_tuned, (d, causal): t})


for D in (() if sys.argv[1:] == ['--time-only'] else (64, 128, 256)):
    for n in (1000, 16384):
        for causal in (False, True):
            g = torch.Generator(device=dev).manual_seed(n + D)
            H = 4 if n < 16384 else 2
            q, k, v = (torch.randn(1, H, n, D, device=dev, generator=g)
                       * torch.linspace(1, 3, H, device=dev)[:, None, None] for _ in range(3))
            (q8, qd), (k8, kd) = new.to_fp8(q), new.to_fp8(k)
            v8t, vd = new.to_fp8(v, transpose=True)
            deq = [x.double() * d.double()[:, :, None, None] for x, d in ((q8, qd), (k8, kd))]
            vdq = (v8t[..., :n].double() * vd.double()[:, :, None, None]).transpose(-1, -2)
            ref, ref_lse = reference(*deq, vdq, causal, D ** -0.5)
            line = []
            for name, mod in (("committed", old), ("fast P V", pv), ("fast P V and Q K^T", new)):
                out, lse = mod.attention_fp8(q8, k8, v8t, q_descale=qd, k_descale=kd,
                                             v_descale=vd, is_causal=causal, return_lse=True)
                err = out.double() - ref
                line.append(f"{name}: max {err.abs().max().item() / ref.abs().max().item():.2e}"
                            f" rms {err.pow(2).mean().sqrt().item() / ref.pow(2).mean().sqrt().item():.2e}"
                            f" lse {(lse.double() - ref_lse).abs().max().item():.1e}"
                            f" nan {bool(out.isnan().any())}")
            print(f"accuracy D={D} H={H} N={n} causal={causal}: " + "; ".join(line), flush=True)

ROUNDS = 3
for D in (128, 256):
    H = 32 if D == 128 else 16
    for n in (4096, 8192, 16384):
        for causal in (True, False):
            g = torch.Generator(device=dev).manual_seed(7)
            q, k, v = (torch.randn(4, H, n, D, device=dev, dtype=torch.bfloat16, generator=g)
                       for _ in range(3))
            (q8, qd), (k8, kd) = new.to_fp8(q), new.to_fp8(k)
            v8t, vd = new.to_fp8(v, transpose=True)
            args = (q8, k8, v8t, qd, kd, vd)
            fns = {"bf16 ours": lambda: new.attention(q, k, v, is_causal=causal),
                   "fp8 committed": lambda: old.attention_fp8(
                       q8, k8, v8t, q_descale=qd, k_descale=kd, v_descale=vd, is_causal=causal),
                   "fp8 fast PV": lambda: pv.attention_fp8(
                       q8, k8, v8t, q_descale=qd, k_descale=kd, v_descale=vd, is_causal=causal),
                   "fp8 fast acc": lambda: new.attention_fp8(
                       q8, k8, v8t, q_descale=qd, k_descale=kd, v_descale=vd, is_causal=causal)}
            others = [(128, 128, 1), (128, 128, 2)] if D == 256 else []
            for tm, tn, occ in others:
                fns[f"fast acc {tm}x{tn} o{occ}"] = lambda e=launch(tm, tn, occ, D, causal): \
                    fp8_forward(*args, causal=causal, scale=D ** -0.5, with_lse=False,
                                platform=e)[0]
            ref = fns["fp8 fast acc"]()
            for name, f in fns.items():
                o = f()
                if name.startswith("fast acc"):  # other tiles: other rounding, same result
                    diff = (o.float() - ref.float()).abs().max().item()
                    assert diff < 0.05, (name, diff)
            times = {name: [] for name in fns}
            names = list(fns)
            for r in range(ROUNDS):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    times[name].append(triton.testing.do_bench_cudagraph(fns[name], rep=60))
            flops = 4 * 4 * H * n * n * D / (2 if causal else 1)
            med = {name: statistics.median(t) for name, t in times.items()}
            print(f"D={D} N={n} causal={causal}: " + ", ".join(
                f"{name} {med[name]:.3f} ms ({flops / med[name] / 1e9:.0f} TFLOPS, "
                f"rounds {min(times[name]):.3f}-{max(times[name]):.3f})" for name in names)
                + "; speed over bf16: " + ", ".join(
                    f"{name} {med['bf16 ours'] / med[name]:.3f}" for name in names[1:]),
                flush=True)
