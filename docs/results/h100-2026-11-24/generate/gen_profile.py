"""generate() of the demo's Llama (8 x 2048 left-padded prompts): prefill and decoding steps
apart (new tokens 1 and 129, rotating rounds), then a profile of 16 decoding steps each."""
import sys, time, statistics, torch
sys.argv = ["demo", "--batch", "8", "--seq-len", "2048"]
from cutile_fmha.assets import fmha_llama_demo as demo
from torch.profiler import ProfilerActivity, profile
args = demo.parse_args(sys.argv[1:])
dev = torch.device("cuda")
ours, sdpa = demo.build_models(args, dev, torch.bfloat16)
tokens = demo.random_tokens(args, dev)
padded, mask = demo.left_padded(tokens)
models = {"cutile_fmha": ours.eval(), "sdpa": sdpa.eval()}
print(torch.cuda.get_device_name(), flush=True)
with torch.no_grad():
    fns = {}
    for name, m in models.items():
        for n in (1, 129):
            fns[f"{name} new={n}"] = (lambda m=m, n=n: demo.generate(m, padded, mask, n))
    secs = demo.seconds_in_turns(fns, dev, 5)
    med = {k: statistics.median(v) for k, v in secs.items()}
    for k, v in secs.items():
        print(f"{k:24s} median {med[k]*1e3:8.1f} ms  rounds {' '.join(f'{x*1e3:.1f}' for x in v)}", flush=True)
    for name in models:
        step = (med[f"{name} new=129"] - med[f"{name} new=1"]) / 128
        print(f"{name}: prefill+1 token {med[f'{name} new=1']*1e3:.1f} ms, per decoding step {step*1e3:.3f} ms", flush=True)
    print(f"decoding steps: cutile_fmha at {((med['sdpa new=129']-med['sdpa new=1'])/(med['cutile_fmha new=129']-med['cutile_fmha new=1'])):.3f}x sdpa's speed; whole generate(128+1): {med['sdpa new=129']/med['cutile_fmha new=129']:.3f}x", flush=True)
    for name, m in models.items():
        demo.generate(m, padded, mask, 17)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter(); demo.generate(m, padded, mask, 17); torch.cuda.synchronize(); wall = time.perf_counter() - t
        ev = prof.key_averages()
        gpu = sum(e.self_device_time_total for e in ev) / 1e3
        syncs = {e.key: e.count for e in ev if any(s in e.key for s in ("Synchronize", "_local_scalar_dense", "cudaMemcpy", "item"))}
        launches = sum(e.count for e in ev if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC"))
        print(f"\n== {name}: generate(17) {wall*1e3:.1f} ms under the profiler; GPU kernel time {gpu:.1f} ms; kernel launches {launches}; syncs {syncs}", flush=True)
        print(ev.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60), flush=True)
        print(ev.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60), flush=True)
