"""row_dot (Delta = rowsum(O * dO)) on 64 query rows a CTA against the launcher's
row_dot_tile_m rows, at each tile width: bf16, B=4, H=32, N=4096, CUDA-graph replays in
rotating rounds; Delta compared bit for bit."""
import statistics

import cuda.tile as ct
import torch
import triton.testing

from cutile_fmha.kernels import backward as kernels
from cutile_fmha.steps.backward import row_dot_tile_m

print(torch.cuda.get_device_name(), flush=True)
for d in (64, 128, 256):
    out, do = (torch.randn(4, 32, 4096, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    deltas = {}

    def launcher(tile_m):
        delta = deltas.setdefault(tile_m, torch.empty(4, 32, 4096, device="cuda"))
        return lambda: ct.launch(torch.cuda.current_stream(), (4096 // tile_m, 32, 4), kernels.row_dot,
                                 (out, do, delta, tile_m, d))

    forms = {m: launcher(m) for m in sorted({64, row_dot_tile_m(d)})}
    for fn in forms.values():
        fn()
    same = all(torch.equal(x, deltas[64]) for x in deltas.values())
    times = {m: [] for m in forms}
    for r in range(7):
        for m in (list(forms) if r % 2 == 0 else list(forms)[::-1]):
            times[m].append(triton.testing.do_bench_cudagraph(forms[m], rep=50))
    print(f"D={d}: " + ", ".join(f"{m} rows {1000 * statistics.median(t):.1f} us "
                                 f"({1000 * min(t):.1f}-{1000 * max(t):.1f})"
                                 for m, t in times.items()) + f"; Delta equal: {same}",
          flush=True)
