"""The window's and the softcap's forward at launches other than step 9's tuned one (D=128).

Cases: window 4096 over N=32768 causal (B=1, H=32/8) and softcap 30 at B=4 H=32 N=8192
causal and not, bf16; each at several (tiles, occupancy, worker warps), against the plain
kernel at the table's launch and (when importable) FlashAttention-4, in rotating rounds of
CUDA-graph replays. Candidates are compiled first in parallel processes (disk cache).

    python variant_launches.py [rounds]
"""
import dataclasses
import json
import multiprocessing as mp
import os
import statistics
import sys

import torch

LAUNCHES = [  # (tile_m, tile_n, occupancy, worker warps)
    (128, 128, 1, 8), (128, 128, 2, 8), (64, 128, 2, None), (128, 64, 2, 8),
    (128, 64, 1, 8), (64, 64, 2, None), (64, 128, 1, None), (64, 128, 3, None)]
CASES = {  # name -> (batch, heads, kv_heads, n, causal, window, softcap)
    "window 4096 N=32768 causal": (1, 32, 8, 32768, True, (4096, 0), None),
    "softcap 30 N=8192 causal": (4, 32, 32, 8192, True, None, 30.0),
    "softcap 30 N=8192 non-causal": (4, 32, 32, 8192, False, None, 30.0),
}


def inputs(case, seed=0):
    b, h, hkv, n, *_ = CASES[case]
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(b, heads, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
            for heads in (h, hkv, hkv)]


def entry_with(launch, causal):
    from cutile_fmha.platforms import entry_for
    from cutile_fmha.platforms.entry import TileShape, TunedLaunch
    entry = entry_for("sm_90")
    m, n, occ, warps = launch
    tuned = TunedLaunch(step=9, tiles=TileShape(m, n), occupancy=occ, num_worker_warps=warps)
    return dataclasses.replace(entry, tuned=entry.tuned | {(128, causal): tuned})


def call(case, launch, q, k, v):
    """A function of no arguments: the case's forward at `launch` (None: attention()'s own)."""
    from cutile_fmha import attention
    from cutile_fmha.steps.variants import Variants, variants_forward
    _, h, hkv, n, causal, window, softcap = CASES[case]
    if launch is None:
        return lambda: attention(q, k, v, is_causal=causal, enable_gqa=True,
                                 window_size=window or (-1, -1), softcap=softcap)
    variants = Variants(window=window, softcap=softcap)
    entry = entry_with(launch, causal)
    scale = 128 ** -0.5
    return lambda: variants_forward(q, k, v, query_offset=0 if causal else None, scale=scale,
                                    with_lse=False, variants=variants, platform=entry)[0]


def warm(job):
    case, launch = job
    try:
        q, k, v = inputs(case)
        call(case, launch, q, k, v)()
        torch.cuda.synchronize()
        return job, "ok"
    except Exception as error:  # a candidate that does not compile is a result
        return job, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def main():
    import triton.testing
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    out_dir = os.environ.get("OUT", ".")
    jobs = [(case, launch) for case in CASES for launch in LAUNCHES]
    with mp.get_context("spawn").Pool(8) as pool:
        status = dict(pool.imap_unordered(warm, jobs))
    for job, s in status.items():
        if s != "ok":
            print("skipped", job, s)
    fa4 = None
    try:
        import flash_attn.cute as fa4
    except Exception as error:
        print("FA4 not importable:", type(error).__name__)
    results = []
    for case in CASES:
        b, h, hkv, n, causal, window, softcap = CASES[case]
        q, k, v = inputs(case, seed=1)
        from cutile_fmha import attention
        calls = {"plain, table launch": lambda: attention(q, k, v, is_causal=causal,
                                                          enable_gqa=True),
                 "variant, table launch": call(case, None, q, k, v)}
        for launch in LAUNCHES:
            if status[(case, launch)] == "ok":
                calls[f"variant {launch}"] = call(case, launch, q, k, v)
        if fa4 is not None:
            fq, fk, fv = (t.transpose(1, 2).contiguous() for t in (q, k, v))
            kw = {"window_size": window} if window else {"softcap": softcap}
            calls["FA4 variant"] = lambda: fa4.flash_attn_func(fq, fk, fv, causal=causal, **kw)[0]
            calls["FA4 plain"] = lambda: fa4.flash_attn_func(fq, fk, fv, causal=causal)[0]
        reference = calls["variant, table launch"]().float()
        errors = {}
        for name, fn in list(calls.items()):
            try:
                o = fn().float()
                torch.cuda.synchronize()
            except Exception as error:  # e.g. FA4 without the variant on sm_90
                print(case, name, "left out:", type(error).__name__, str(error).splitlines()[0][:200])
                del calls[name]
                continue
            if name.startswith("FA4"):
                o = o.transpose(1, 2)
            if "plain" not in name:
                errors[name] = ((o - reference).norm() / reference.norm()).item()
        times = {name: [] for name in calls}
        for r in range(rounds):
            names = list(calls)
            names = names[r % len(names):] + names[:r % len(names)]
            for name in names:
                try:
                    times[name].append(triton.testing.do_bench_cudagraph(calls[name], rep=200))
                except Exception as error:
                    print(case, name, "failed:", type(error).__name__, str(error)[:200])
                    times[name].append(float("nan"))
        base = statistics.median(times["plain, table launch"])
        var_table = statistics.median(times["variant, table launch"])
        fa4_var = statistics.median(times["FA4 variant"]) if "FA4 variant" in times else None
        print(f"\n{case}: plain (table) {base:.3f} ms")
        for name, t in times.items():
            med = statistics.median(t)
            row = {"case": case, "method": name, "ms": med, "rounds": t,
                   "over_plain": med / base, "over_variant_table": med / var_table,
                   "over_fa4_variant": med / fa4_var if fa4_var else None,
                   "rel_error_vs_table": errors.get(name)}
            results.append(row)
            print(f"  {name:32s} {med:8.3f} ms  /plain {med / base:.3f}  /table {med / var_table:.3f}"
                  + (f"  /FA4 {med / fa4_var:.3f}" if fa4_var else "")
                  + (f"  err {errors[name]:.1e}" if name in errors else ""))
    with open(os.path.join(out_dir, "variant-launches.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
