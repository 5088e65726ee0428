"""The softcap's forward at launches other than step 9's tuned one, at D 64, 128 and 256.

Softcap 30, bf16, B=4, H=32 (16 at D=256), N=8192, causal and not; each case at several
(tiles, occupancy, worker warps) against the plain kernel and the softcap at the table's
launch, in rotating rounds of CUDA-graph replays. Candidates are compiled first in
parallel processes (disk cache). After docs/results/h100-2026-11-26/variants/launches/
(D=128 only).

    python softcap_launches.py [rounds] > softcap-launches.log
"""
import dataclasses
import json
import multiprocessing as mp
import statistics
import sys

import torch

LAUNCHES = {  # head dim -> [(tile_m, tile_n, occupancy, worker warps)]
    64: [(128, 128, 1, 8), (128, 64, 2, None), (64, 128, 2, None), (64, 64, 3, None),
         (128, 64, 1, 8), (128, 32, 2, 8)],
    128: [(128, 128, 1, 8), (64, 128, 2, None), (128, 64, 2, 8), (64, 64, 2, None),
          (128, 64, 1, 8), (64, 128, 1, None)],
    256: [(128, 128, 1, 8), (128, 64, 1, 8), (64, 128, 1, None), (64, 64, 2, None),
          (128, 32, 1, 8), (64, 64, 1, 8)],
}
CASES = [(d, causal) for d in (128, 256, 64) for causal in (True, False)]
SOFTCAP = 30.0


def inputs(d, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    heads = 16 if d == 256 else 32
    return [torch.randn(4, heads, 8192, d, device="cuda", dtype=torch.bfloat16, generator=g)
            for _ in range(3)]


def entry_with(launch, d, causal):
    from cutile_fmha.platforms import entry_for
    from cutile_fmha.platforms.entry import TileShape, TunedLaunch
    entry = entry_for("sm_90")
    m, n, occ, warps = launch
    tuned = TunedLaunch(step=9, tiles=TileShape(m, n), occupancy=occ, num_worker_warps=warps)
    return dataclasses.replace(entry, tuned=entry.tuned | {(d, causal): tuned})


def call(d, causal, launch, q, k, v):
    """A function of no arguments: the softcap forward at `launch` (None: attention()'s)."""
    from cutile_fmha import attention
    from cutile_fmha.steps.variants import Variants, variants_forward
    if launch is None:
        return lambda: attention(q, k, v, is_causal=causal, softcap=SOFTCAP)
    entry = entry_with(launch, d, causal)
    return lambda: variants_forward(q, k, v, query_offset=0 if causal else None,
                                    scale=d ** -0.5, with_lse=False,
                                    variants=Variants(softcap=SOFTCAP), platform=entry)[0]


def warm(job):
    d, causal, launch = job
    try:
        q, k, v = inputs(d)
        call(d, causal, launch, q, k, v)()
        torch.cuda.synchronize()
        return job, "ok"
    except Exception as error:  # a candidate that does not compile is a result
        return job, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def main():
    import triton.testing
    from cutile_fmha import attention
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    print(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__}),
          flush=True)
    jobs = [(d, causal, launch) for d, causal in CASES for launch in LAUNCHES[d]]
    with mp.get_context("spawn").Pool(12) as pool:
        status = dict(pool.imap_unordered(warm, jobs))
    for job, s in status.items():
        if s != "ok":
            print(json.dumps({"skipped": list(job), "why": s}), flush=True)
    for d, causal in CASES:
        q, k, v = inputs(d, seed=1)
        calls = {"plain": lambda: attention(q, k, v, is_causal=causal),
                 "softcap, table": call(d, causal, None, q, k, v)}
        for launch in LAUNCHES[d]:
            if status[(d, causal, launch)] == "ok":
                calls[f"softcap {launch}"] = call(d, causal, launch, q, k, v)
        reference = calls["softcap, table"]().float()
        errors = {name: ((fn().float() - reference).norm() / reference.norm()).item()
                  for name, fn in calls.items() if name != "plain"}
        times = {name: [] for name in calls}
        names = list(calls)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(triton.testing.do_bench_cudagraph(calls[name], rep=100))
        med = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(json.dumps({"D": d, "causal": causal, "method": name, "ms": med[name],
                              "over_plain": med[name] / med["plain"],
                              "over_softcap_table": med[name] / med["softcap, table"],
                              "rounds_ms": t, "rel_error_vs_table": errors.get(name)}),
                  flush=True)


if __name__ == "__main__":
    main()
