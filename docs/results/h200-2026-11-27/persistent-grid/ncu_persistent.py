"""Kernels to read with Nsight Compute: step 9 and the persistent grid of
persistent_order.py at step 9's launches, bf16, B=4, H=32, N=4096, D=128, causal (one CTA
per SM) and not (two). Run under
    ncu --profile-from-start off --set full --clock-control none -o rep python3 ncu_persistent.py
(the range is cudaProfilerStart/Stop); ncu_summary.py reads the report's raw and source
pages."""
import sys
from pathlib import Path

import cuda.tile as ct
import torch

sys.path.insert(0, str(Path(__file__).parent))
from persistent_order import persistent  # noqa: E402
from cutile_fmha.platforms import entry_for  # noqa: E402
from cutile_fmha.steps.definitions import STEPS  # noqa: E402
from cutile_fmha.steps.launcher import build_plan, current_stream  # noqa: E402

B, H, N, D = 4, 32, 4096, 128
sms = torch.cuda.get_device_properties(0).multi_processor_count
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
           for _ in range(3))
launches = []
for causal in (True, False):
    plan = build_plan(q, k, v, causal=causal, scale=None, step=9, platform=None, out=None,
                      with_lse=False)
    _, hints = STEPS[9].launch_config(entry_for("sm_90"), native=True, head_dim=D, causal=causal)
    kernel = persistent.replace_hints(**{a: b for a, b in hints.items() if b is not None})
    out = torch.empty_like(q)
    args = (q, k, v, out) + plan.args[4:]
    grid = (sms * (hints.get("occupancy") or 1), 1, 1)
    launches += [(f"step 9, causal={causal}", plan.launch),
                 (f"persistent, causal={causal}",
                  lambda grid=grid, kernel=kernel, args=args:
                  ct.launch(current_stream(q.device), grid, kernel, args))]
for _, launch in launches * 2:  # compiles outside the profiled range
    launch()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for name, launch in launches:
    print("profiled:", name, flush=True)
    launch()
    torch.cuda.synchronize()
torch.cuda.profiler.stop()
