"""FP8 forward's error with and without incoherent_rotation (FlashAttention-3's incoherent
processing), against float64 attention of the same bfloat16 inputs; our bfloat16 forward
beside it. Inputs: standard normal; FlashAttention-3's test inputs (N(0,1), plus N(0,10)
on 0.1% of the entries, in Q, K and V); and two channels of Q and K 20x the others (as
language models' activations have). B=2, H=8, N=2048, bf16, D 128 and 256, causal and
not. RMS error of the output (absolute, as FlashAttention-3 reports it) and relative to
the output's RMS. Then the rotation's own time beside attention_fp8's at B=4, H=32,
N=8192, D=128."""
import json, math, torch, triton.testing as tt
import cutile_fmha
from cutile_fmha import attention_fp8, incoherent_rotation, to_fp8

print(json.dumps({"gpu": torch.cuda.get_device_name()}))
g = torch.Generator(device="cuda").manual_seed(0)
B, H, N = 2, 8, 2048

def make(kind, d):
    shape = (B, H, N, d)
    x = [torch.randn(shape, generator=g, device="cuda", dtype=torch.float64) for _ in range(3)]
    if kind == "entries":
        x = [t + (torch.rand(shape, generator=g, device="cuda", dtype=torch.float64) < 1e-3)
             * 10 * torch.randn(shape, generator=g, device="cuda", dtype=torch.float64) for t in x]
    if kind == "channels":
        c = torch.ones(d, device="cuda", dtype=torch.float64)
        c[[3, 77]] = 20.0
        x = [x[0] * c, x[1] * c, x[2]]
    return [t.to(torch.bfloat16) for t in x]

def reference(q, k, v, causal):
    s = q.double() @ k.double().transpose(2, 3) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(N, N, device="cuda", dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v.double()

def fp8(q, k, v, causal):
    (q8, qd), (k8, kd), (v8, vd) = to_fp8(q), to_fp8(k), to_fp8(v, transpose=True)
    return attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, is_causal=causal)

for d in (128, 256):
    for kind in ("normal", "entries", "channels"):
        q, k, v = make(kind, d)
        for causal in (False, True):
            ref = reference(q, k, v, causal)
            rms = ref.pow(2).mean().sqrt().item()
            outs = {"bf16": cutile_fmha.attention(q, k, v, is_causal=causal),
                    "fp8": fp8(q, k, v, causal),
                    "fp8 rotated": fp8(*incoherent_rotation(q, k, generator=torch.Generator().manual_seed(1)), v, causal)}
            row = {"D": d, "inputs": kind, "causal": causal, "output_rms": rms}
            for name, out in outs.items():
                e = (out.double() - ref).pow(2).mean().sqrt().item()
                row[name + " rmse"] = e
                row[name + " rmse / output rms"] = e / rms
            print(json.dumps(row), flush=True)
            del ref, outs

# time: the rotation of Q and K against the FP8 forward at B=4, H=32, N=8192, D=128
q, k, v = (torch.randn(4, 32, 8192, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
(q8, qd), (k8, kd), (v8, vd) = to_fp8(q), to_fp8(k), to_fp8(v, transpose=True)
times = {"incoherent_rotation(q, k)": tt.do_bench(lambda: incoherent_rotation(q, k), rep=200),
         "to_fp8 of q, k, v": tt.do_bench(lambda: (to_fp8(q), to_fp8(k), to_fp8(v, transpose=True)), rep=200),
         "attention_fp8, causal": tt.do_bench_cudagraph(lambda: attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, is_causal=True), rep=200),
         "attention_fp8, not causal": tt.do_bench_cudagraph(lambda: attention_fp8(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd), rep=200)}
print(json.dumps({"B=4 H=32 N=8192 D=128 ms": times}), flush=True)
