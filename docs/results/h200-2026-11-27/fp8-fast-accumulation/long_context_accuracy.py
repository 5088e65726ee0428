"""Long contexts: does accumulating in the tensor cores lose accuracy where many key tiles
add into one output? Hopper's float8 products accumulate with 13 mantissa bits (the
added-to value truncated), so the committed kernel (cutile_fmha_old: each product added in
float32 registers) and the fast-accumulation one (cutile_fmha) are compared against float64
on the dequantized float8 inputs, at 32k and 128k keys: the first and last 128 query rows
(the last see every key under the causal mask), B=1, H=2, standard-normal inputs."""
import torch
import cutile_fmha as new
import cutile_fmha_old as old

dev = torch.device("cuda")
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
for D in (128, 256):
    for n in (32768, 131072):
        for causal in (True, False):
            g = torch.Generator(device=dev).manual_seed(n + D)
            q, k, v = (torch.randn(1, 2, n, D, device=dev, generator=g) for _ in range(3))
            (q8, qd), (k8, kd) = new.to_fp8(q), new.to_fp8(k)
            v8t, vd = new.to_fp8(v, transpose=True)
            kq = k8.double() * kd.double()[:, :, None, None]
            vq = (v8t[..., :n].double() * vd.double()[:, :, None, None]).transpose(-1, -2)
            rows = torch.cat([torch.arange(128, device=dev), torch.arange(n - 128, n, device=dev)])
            qq = q8[:, :, rows].double() * qd.double()[:, :, None, None]
            s = qq @ kq.transpose(-1, -2) * D ** -0.5
            if causal:
                s = s.masked_fill(torch.arange(n, device=dev)[None, :] > rows[:, None], float("-inf"))
            lse = torch.logsumexp(s, -1)
            ref = torch.exp(s - lse[..., None]) @ vq
            line = []
            for name, mod in (("committed", old), ("fast accumulation", new)):
                out, out_lse = mod.attention_fp8(q8, k8, v8t, q_descale=qd, k_descale=kd,
                                                 v_descale=vd, is_causal=causal, return_lse=True)
                err = out[:, :, rows].double() - ref
                last = err[:, :, 128:]
                line.append(f"{name}: max {err.abs().max().item() / ref.abs().max().item():.2e}"
                            f" rms {err.pow(2).mean().sqrt().item() / ref.pow(2).mean().sqrt().item():.2e}"
                            f" (last rows rms {last.pow(2).mean().sqrt().item() / ref[:, :, 128:].pow(2).mean().sqrt().item():.2e})"
                            f" lse {(out_lse[:, :, rows].double() - lse).abs().max().item():.1e}")
            print(f"D={D} N={n} causal={causal}: " + "; ".join(line), flush=True)
            del s, ref, kq, vq
