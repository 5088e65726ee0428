"""The decode kernel launched programmatically (its CTAs start under the previous kernel's
tail and wait on the GPU for it, sm_90) against the committed launch (cutile_fmha_old),
and SDPA cuDNN where it runs the shape: dense caches, 32/8 heads, D=128, bf16, one token,
the table's split rule; CUDA-graph replays (do_bench_cudagraph) of back-to-back calls, 7
rounds in a rotating order; outputs compared bit for bit. Also each call after a small
copy kernel (as a model's cache update precedes it): the pair timed."""
import statistics, torch, triton.testing as tt
from torch.nn.attention import SDPBackend, sdpa_kernel
import cutile_fmha as new
import cutile_fmha_old as old
name = torch.cuda.get_device_name()
peak = 4.8e12 if "H200" in name else 3.35e12
print(name, torch.__version__, flush=True)
H, HKV, D, ROUNDS = 32, 8, 128, 7
for batch, cache in ((1, 512), (1, 1024), (1, 4096), (1, 32768), (4, 4096), (16, 4096), (16, 32768), (64, 4096)):
    g = torch.Generator(device="cuda").manual_seed(batch * cache)
    q = torch.randn(batch, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(batch, HKV, cache, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    src, dst = torch.randn(batch, HKV, 1, D, device="cuda"), torch.empty(batch, HKV, 1, D, device="cuda")
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    fns = {"old": lambda: old.attention_with_kvcache(q, k, v, lens),
           "new": lambda: new.attention_with_kvcache(q, k, v, lens),
           "old after a copy": lambda: (dst.copy_(src), old.attention_with_kvcache(q, k, v, lens)),
           "new after a copy": lambda: (dst.copy_(src), new.attention_with_kvcache(q, k, v, lens)),
           "cuDNN": cudnn}
    a, b = fns["old"](), fns["new"]()
    assert torch.equal(a, b), (batch, cache)
    names = list(fns)
    res = {n: [] for n in names}
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append(tt.do_bench_cudagraph(fns[n], rep=100) * 1e3)
    med = {n: statistics.median(t) for n, t in res.items()}
    kv = 2 * batch * HKV * cache * D * 2
    print(f"batch {batch} x {cache}: old {med['old']:.2f} us ({kv / med['old'] / 1e-6 / peak * 100:.1f}%), "
          f"new {med['new']:.2f} ({kv / med['new'] / 1e-6 / peak * 100:.1f}%), new/old "
          f"{med['new'] / med['old']:.3f}; after a copy: old {med['old after a copy']:.2f}, new "
          f"{med['new after a copy']:.2f} ({med['new after a copy'] / med['old after a copy']:.3f}); "
          f"cuDNN {med['cuDNN']:.2f} ({kv / med['cuDNN'] / 1e-6 / peak * 100:.1f}%)", flush=True)
