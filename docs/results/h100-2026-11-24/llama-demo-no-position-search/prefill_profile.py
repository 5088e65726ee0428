"""The Llama demo's prefill (B=4 x 2048, bf16) under torch.profiler, each backend: own GPU
time per operator and kernel per prefill, and wall time per prefill with and without it."""
import sys, time, torch
from tabulate import tabulate
from torch.profiler import ProfilerActivity, profile
sys.argv = ["demo"]
from cutile_fmha.assets import fmha_llama_demo as demo
args = demo.parse_args([])
device = torch.device("cuda")
ours, theirs = demo.build_models(args, device, torch.bfloat16)
tokens = demo.random_tokens(args, device)
N = 5
with torch.no_grad():
    for name, model in (("cutile_fmha", ours.eval()), ("sdpa", theirs.eval())):
        for _ in range(3): model(tokens)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(N): model(tokens)
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / N
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(N): model(tokens)
            torch.cuda.synchronize()
        ev = sorted((e for e in prof.key_averages() if e.self_device_time_total > 0), key=lambda e: -e.self_device_time_total)
        total = sum(e.self_device_time_total for e in ev) / N / 1e3
        print(f"{name}: {wall*1e3:.2f} ms per prefill (wall), {total:.2f} ms of own GPU time per prefill")
        print(tabulate([[f"{e.self_device_time_total/N/1e3:.3f}", f"{e.count/N:g}", e.key[:110]] for e in ev[:22]],
                       headers=["GPU ms per prefill", "calls", "operator or kernel"]))
        cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:12]
        print(tabulate([[f"{e.self_cpu_time_total/N/1e3:.3f}", f"{e.count/N:g}", e.key[:110]] for e in cpu],
                       headers=["CPU ms per prefill (own)", "calls", "operator"]))
        print(flush=True)
