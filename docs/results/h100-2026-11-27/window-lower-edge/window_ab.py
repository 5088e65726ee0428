"""The window probe's four forms (window_probe.py) against the committed window kernel,
the full causal attention and FA4's windowed forward where importable: B=1, H=32/8, D=128,
bf16, N=32768 with a window of 4096 and N=8192 with 1024, causal; 5 rotating rounds of
CUDA-graph replays (medians, ms); outputs against the committed kernel's."""
import json, statistics, sys, torch, triton.testing as tt
import cuda.tile as ct
sys.path.insert(0, "docs/results/h100-2026-11-27/window-lower-edge")
from window_probe import fmha_probe
import cutile_fmha
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.family import FORWARD_VARIANTS, UNUSED_ARRAY
from cutile_fmha.steps.variants import Variants, variants_kernel
try:
    from flash_attn.cute import flash_attn_func
except Exception as e:  # noqa: BLE001
    flash_attn_func = None
    print("FA4 not importable:", e)

entry = entry_for("sm_90")
FORMS = {0: "probe, committed order", 1: "probe, lower edge left out (wrong)",
         2: "probe, lower edge unmasked (wrong)", 3: "probe, one masked loop"}
for n, window in ((32768, 4096), (8192, 1024)):
    g = torch.Generator(device="cuda").manual_seed(n)
    q = torch.randn(1, 32, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 8, n, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    variants = Variants(window=(window, 0))
    _, constants = variants_kernel(entry, head_dim=128, causal=True, query_group=4, write_lse=False,
                                   variants=variants)
    out = torch.empty_like(q)
    values = {"Q": q, "K": k, "V": v, "Out": out, "Lse": UNUSED_ARRAY, "qk_scale": 128 ** -0.5,
              "query_offset": 0, **constants,
              **variants.values(q_rows=n, k_rows=n, causal=True, sinks=None)}
    grid, args = FORWARD_VARIANTS.grid(values), FORWARD_VARIANTS.arguments(values)
    def probe(form):
        def run():
            ct.launch(torch.cuda.current_stream(), grid, fmha_probe, args + (form,))
            return out
        return run
    fns = {"committed window": lambda: cutile_fmha.attention(q, k, v, is_causal=True, enable_gqa=True,
                                                             window_size=(window, 0)),
           "committed full causal": lambda: cutile_fmha.attention(q, k, v, is_causal=True, enable_gqa=True)}
    fns |= {FORMS[f]: probe(f) for f in FORMS}
    if flash_attn_func is not None:
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        fns["FA4 windowed"] = lambda: flash_attn_func(qt, kt, vt, causal=True, window_size=(window, 0))
    ref = fns["committed window"]().float()
    diffs = {}
    for name, fn in fns.items():
        if name.startswith("probe"):
            diffs[name] = (fn().float() - ref).abs().max().item()
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(5):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(tt.do_bench_cudagraph(fns[name], rep=100))
    med = {name: statistics.median(t) for name, t in times.items()}
    for name in names:
        print(json.dumps({"N": n, "window": window, "method": name, "ms": round(med[name], 4),
                          "over_committed_window": round(med[name] / med["committed window"], 4),
                          "max_diff_vs_committed": diffs.get(name), "rounds": times[name]}), flush=True)
