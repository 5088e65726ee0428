"""Step 9's causal launch at D=128 on short sequences: the table's 128x128 (occupancy 1,
tuned at N=8192) against other tiles, with SDPA cuDNN, in rotating rounds (CUDA graphs)."""
import dataclasses, statistics, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.steps import attention
from cutile_fmha.platforms import TileShape, entry_for
from cutile_fmha.platforms.entry import TunedLaunch
from cutile_fmha.assets import measure
base = entry_for("sm_90")
def entry(tm, tn, occ, warps):
    launch = TunedLaunch(step=9, tiles=TileShape(tm, tn), occupancy=occ, num_worker_warps=warps)
    return dataclasses.replace(base, tuned={**base.tuned, (128, True): launch})
candidates = {"128x128 occ1 w8 (table)": entry(128, 128, 1, 8), "64x128 occ2": entry(64, 128, 2, None)}
print(torch.cuda.get_device_name(), flush=True)
for (b, h, kv, n) in ((4, 16, 4, 2048), (4, 16, 16, 2048), (8, 16, 4, 2048), (4, 32, 8, 2048), (4, 32, 8, 4096),
                      (4, 32, 8, 8192), (1, 32, 8, 16384), (4, 32, 4, 4096), (4, 32, 32, 8192), (16, 32, 8, 1024)):
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(b, kv, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    fns = {name: (lambda e=e: attention(q, k, v, causal=True, platform=e)) for name, e in candidates.items()}
    ref = fns["128x128 occ1 w8 (table)"]()
    for name, f in fns.items():
        assert torch.equal(f(), ref) or (f() - ref).abs().max() < 2e-2, name
    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv != h)
    fns["SDPA cuDNN"] = cudnn
    times = measure.time_in_rounds(list(fns.values()), 4, measure.time_ms)
    flops = measure.attention_flops(b, h, n, n, 128, True)
    print(f"B={b} H={h}/{kv} N={n} D=128 causal bf16:", flush=True)
    table = {name: statistics.median(t) for name, t in zip(fns, times)}
    for name, t in table.items():
        print(f"  {name:26s} {t*1e3:8.1f} us  {measure.tflops(flops, t):5.0f} TFLOPS  /table {t/table['128x128 occ1 w8 (table)']:.3f}  rounds {' '.join(f'{x*1e3:.1f}' for x in times[list(fns).index(name)])}", flush=True)
