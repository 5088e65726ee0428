"""One decode step (attention_with_kvcache, B=1, 32/8 heads, D=128, q_len 1, bf16) in a CUDA
graph: before (cutile_fmha_old: the split-LSE buffer made by a clone, a kernel inside the
captured graph) and after (two allocations, no kernel), and SDPA's cuDNN backend. The
kernels of 200 replays under torch.profiler, and do_bench_cudagraph in 7 rotating rounds."""
import statistics, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench_cudagraph
import cutile_fmha as new
import cutile_fmha_old as old

dev, dt = "cuda", torch.bfloat16
print(torch.cuda.get_device_name(), torch.__version__, flush=True)


def cudnn(q, kc, vc):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)


for n in (1024, 4096, 16384):
    g = torch.Generator(device=dev).manual_seed(n)
    q = torch.randn(1, 32, 1, 128, device=dev, dtype=dt, generator=g)
    kc = torch.randn(1, 8, n, 128, device=dev, dtype=dt, generator=g); vc = torch.randn_like(kc)
    lens = torch.full((1,), n, dtype=torch.int32, device=dev)
    calls = {"old": lambda: old.attention_with_kvcache(q, kc, vc, lens),
             "new": lambda: new.attention_with_kvcache(q, kc, vc, lens),
             "cuDNN": lambda: cudnn(q, kc, vc)}
    assert torch.equal(calls["old"](), calls["new"]()), n
    err = (calls["new"]().float() - calls["cuDNN"]().float()).abs().max().item()
    print(f"\n== cache {n}: max |ours - cuDNN| {err:.2e}", flush=True)
    for name, f in calls.items():
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            f(); f()
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            f()
        for _ in range(20):
            graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(200):
                graph.replay()
            torch.cuda.synchronize()
        print(f"-- {name}: kernels in one replay (us per replay)")
        for e in prof.key_averages():
            if e.device_type.name == "CUDA" and e.count >= 200:
                print(f"   {e.count // 200} x {e.key[:90]:90s} {e.device_time_total / 200:7.2f}")
    times = {k: [] for k in calls}
    names = list(calls)
    for r in range(7):
        for k in names[r % 3:] + names[:r % 3]:
            times[k].append(do_bench_cudagraph(calls[k], rep=100) * 1e3)
    print("do_bench_cudagraph, us, median of 7 rotating rounds (min-max):")
    for k, v in times.items():
        print(f"   {k:6s} {statistics.median(v):7.2f} ({min(v):.2f}-{max(v):.2f})", flush=True)
