"""Batch 16 x 4096-key dense cache, one token, 32/8 heads, D=128, bf16: the decode kernel
at several launches (keys per tile, occupancy, split count forced) against SDPA cuDNN, 5
rotating rounds of CUDA-graph replays; K/V bytes per second against the HBM peak."""
import statistics, torch, triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.platforms import DecodeLaunch
from cutile_fmha.steps.decode import DecodeShape, decode_forward

B, HQ, HKV, D, N = 16, 32, 8, 128, 4096
name = torch.cuda.get_device_name()
peak = 4.8e12 if "H200" in name else 3.35e12
print(name, torch.__version__, flush=True)
q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
shape = lambda splits: DecodeShape(batch=B, head_dim=D, kv_heads=HKV, group=HQ // HKV, q_len=1,
                                   capacity=N, block_size=None, causal=False, has_starts=False,
                                   has_lengths=False, write_lse=False, num_splits=splits)
cases = {}
for tile_n, occ, splits in ((128, 2, 1), (128, 1, 1), (128, 3, 1), (64, 2, 1), (64, 3, 1),
                            (64, 4, 1), (256, 1, 1), (128, 2, 2), (64, 2, 2), (128, 2, 4)):
    launch = DecodeLaunch(tile_n, occ, None, 1, 128)
    cases[f"ours {tile_n} keys x occ {occ}, {splits} split(s)"] = \
        lambda launch=launch, s=shape(splits): decode_forward(q, k, v, s, scale=D ** -0.5,
                                                              launch=launch)
kx, vx = (t.repeat_interleave(HQ // HKV, 1) for t in (k, v))
def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, kx, vx)
cases["SDPA cuDNN (expanded K/V)"] = cudnn
ref = cudnn()
for n, f in cases.items():
    out = f()
    out = out[0] if isinstance(out, tuple) else out
    err = (out.float() - ref.float()).abs().max().item()
    assert err < 2e-2, (n, err)
times = {n: [] for n in cases}
names = list(cases)
for r in range(5):
    for n in names[r % len(names):] + names[:r % len(names)]:
        times[n].append(triton.testing.do_bench_cudagraph(cases[n], rep=200) * 1e3)
bytes_kv = 2 * B * HKV * N * D * 2
print(f"K/V bytes {bytes_kv / 1e6:.1f} MB; peak {peak / 1e12:.2f} TB/s; 90% is "
      f"{bytes_kv / (0.9 * peak) * 1e6:.1f} us")
for n in names:
    t = statistics.median(times[n])
    print(f"  {n:40s} {t:7.2f} us ({min(times[n]):.2f}-{max(times[n]):.2f})  "
          f"{bytes_kv / (t * 1e-6) / peak * 100:.1f}% of peak", flush=True)
