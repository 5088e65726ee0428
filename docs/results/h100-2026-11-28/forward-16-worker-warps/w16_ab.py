"""Step 9 with 16 worker warps (four consumer warpgroups of 64 rows, 256-row tiles) against
the table's launches and SDPA cuDNN, bf16, B=4, H=32; five rotating rounds of CUDA-graph
replays (medians, ms). cuda-tile 1.7.0 takes worker-warp counts other than 4 and 8 only
with Tile IR bytecode 13.5, which it writes only with its development features on: this
script turns them on (a private switch) and needs tileiras 13.5. Every kernel of the
process is then written as bytecode 13.5 (the table's launches compile to the same sm_90
code under 13.4 and 13.5). Outputs are checked against float64 at N=1000 (B=1, H=4) and
against the table launch's at the timed sizes. FlashAttention-4 is timed in the same rounds
where flash_attn.cute is importable."""
import dataclasses, json, statistics, subprocess, sys
import cuda.tile._compile as tile_compile
tile_compile.dev_features_enabled = lambda: True
import torch, triton.testing as tt
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from cutile_fmha.assets import measure
from cutile_fmha.steps import attention
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import TileShape, TunedLaunch

table = entry_for("sm_90")
fa4 = measure.flash_attention_4()
def with_launch(d, causal, launch):
    return dataclasses.replace(table, tuned=table.tuned | {(d, causal): launch})
print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                  "tileiras": subprocess.run(["tileiras", "--version"], capture_output=True,
                                             text=True).stdout.split("release")[-1].strip(),
                  "table": {f"{d}-{c}": str(table.tuned_launch(d, c)) for d in (64, 128)
                            for c in (True, False)}}), flush=True)
ROUNDS = 5
CASES = [(64, causal, (4096, 8192, 16384), ((256, 64), (256, 32))) for causal in (True, False)] + \
        [(128, causal, (4096, 16384), ((256, 32),)) for causal in (True, False)]
if len(sys.argv) > 1:
    CASES = [c for c in CASES if str(c[0]) in sys.argv[1:]]
for d, causal, ns, shapes in CASES:
    entries = {"table": table} | {
        f"{m}x{n} w16": with_launch(d, causal, TunedLaunch(9, TileShape(m, n), 1, 16))
        for m, n in shapes}
    g = torch.Generator(device="cuda").manual_seed(d + causal)
    q, k, v = (torch.randn(1, 4, 1000, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    for name, e in entries.items():
        out = attention(q, k, v, causal=causal, platform=e)
        print(json.dumps({"D": d, "causal": causal, "N": 1000, "method": name,
                          "max_err_vs_float64": (out.double() - ref).abs().max().item(),
                          "nan": bool(out.isnan().any())}), flush=True)
    for n in ns:
        q, k, v = (torch.randn(4, 32, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        fns = {name: (lambda e=e: attention(q, k, v, causal=causal, platform=e))
               for name, e in entries.items()}
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["cudnn"] = cudnn
        if fa4 is not None:
            fns["fa4"] = measure.fa4_forward(fa4, *measure.fa4_inputs(q, k, v), causal=causal)
        base = fns["table"]()
        diff = {name: ((fn().transpose(1, 2) if name == "fa4" else fn()) - base).abs().max().item()
                for name, fn in fns.items()}
        times = {name: [] for name in fns}
        names = list(fns)
        for r in range(ROUNDS):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(tt.do_bench_cudagraph(fns[name], rep=100))
        flops = 4 * 4 * 32 * n * n * d / (2 if causal else 1)
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(json.dumps({"D": d, "causal": causal, "N": n, "method": name, "ms": med[name],
                              "tflops": flops / med[name] / 1e9,
                              "over_table": med[name] / med["table"], "rounds": t,
                              "max_diff_vs_table": diff[name]}), flush=True)
