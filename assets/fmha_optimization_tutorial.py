"""The optimization tutorial: PyTorch SDPA (step 0), then every step, one idea at a time.

    python assets/fmha_optimization_tutorial.py --correctness-check
    python assets/fmha_optimization_tutorial.py --head-dim 512   # steps 10-11 against SDPA
                                                                 # efficient

Steps 1-9 run head dims 64, 128 and 256, steps 10 and 11 the ones past 256: each run
shows the steps of its head dim.

Prints, per step: latency, TFLOPS, speedup against step 1, the previous step and each
SDPA backend measured in the same run, the first launch's time (the compile, unless
cuTile's disk cache already holds the kernel) and, with --correctness-check, the
largest error against a float64 reference next to SDPA's own.
"""

import argparse
import sys
import time

import torch

from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import LARGE_HEAD_DIMS
from cutile_fmha.steps import attention, plan_launch
from cutile_fmha.steps.reference import reference_errors

COLUMNS = [
    Column("step", "Step"),
    Column("optimization", "Optimization"),
    Column("latency_ms", "Latency (ms)", ".3f"),
    Column("tflops", "TFLOPS", ".1f"),
    Column("vs_step1", "vs step 1", ".2f"),
    Column("vs_previous", "vs previous", ".2f"),
]

def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-len", type=measure.positive_int, default=2048,
                        help="query and key length")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
    measure.add_run_arguments(parser, sdpa_backends=None,
                              iterations_help="timed runs per step",
                              sdpa_help="SDPA backends to time as step 0 (default: flash and "
                                        "cudnn; past D=256, where only it runs, efficient)")
    parser.add_argument("--correctness-check", action="store_true",
                        help="compare every output with a float64 reference")
    measure.add_result_arguments(parser)
    args = parser.parse_args(argv)
    measure.check_run_arguments(parser, args)
    if args.sdpa_backends is None:
        args.sdpa_backends = ["efficient"] if args.head_dim in LARGE_HEAD_DIMS else \
            ["flash", "cudnn"]
    return args


def columns_for(backends: list[str], correctness: bool) -> list[Column]:
    ratios = [Column(f"vs_sdpa_{b}", f"vs SDPA {b}", ".2f") for b in backends]
    checks = [Column("max_error", "max error", ".1e"), Column("correct", "correct")] \
        if correctness else []
    return COLUMNS + ratios + [Column("first_launch_s", "first launch (s)", ".2f")] + checks


def _measure(method, shape, iterations) -> dict:
    """First-launch wall time (compile included), then the median latency."""
    start = time.perf_counter()
    method.run()
    torch.cuda.synchronize()
    first_launch_s = time.perf_counter() - start
    latency_ms = measure.time_ms(method.run, iterations)
    return {"step": method.step, "optimization": method.name, "latency_ms": latency_ms,
            "tflops": measure.tflops(shape.flops, latency_ms), "first_launch_s": first_launch_s}


def _check(method, q, k, v, causal, platform) -> float:
    """Largest error of one call against float64, its output poisoned with NaN first."""
    if method.step == measure.SDPA_STEP:
        out = method.run()
    else:
        out = attention(q, k, v, causal=causal, step=method.step, platform=platform,
                        out=torch.full_like(q, float("nan")))
    return reference_errors(out, q, k, v, causal=causal)[0]


def run(args) -> tuple[dict, list[dict]]:
    """Times SDPA's backends and the chosen steps; returns (context, rows)."""
    shape = measure.Shape(args.batch, measure.heads_for(args.head_dim, args.heads), args.seq_len,
                          args.seq_len, args.head_dim, args.causal, args.dtype, args.kv_heads)
    q, k, v = measure.make_inputs(shape)
    entry = plan_launch(q, k, v, causal=shape.causal, platform=args.platform).entry
    context = measure.run_context(entry) | {"shape": measure.describe_shape(shape)}
    found = measure.methods(q, k, v, causal=shape.causal, steps=args.steps,
                            sdpa_backends=args.sdpa_backends, platform=args.platform)
    for backend in set(args.sdpa_backends) - {m.backend for m in found}:
        print(f"SDPA {backend}: not available for these inputs on this GPU")
    rows = [_measure(method, shape, args.iterations) for method in found]
    if args.correctness_check:
        errors = [_check(method, q, k, v, shape.causal, args.platform) for method in found]
        sdpa_errors = [e for m, e in zip(found, errors) if m.step == measure.SDPA_STEP]
        # With no SDPA backend timed, PyTorch's own choice sets the bar.
        bar = min(sdpa_errors) if sdpa_errors else reference_errors(
            measure.sdpa(q, k, v, causal=shape.causal), q, k, v, causal=shape.causal)[0]
        for row, error in zip(rows, errors):
            row["max_error"] = error
            row["correct"] = "reference" if row["step"] == measure.SDPA_STEP else \
                "yes" if measure.within_tolerance(error, bar, q.dtype) else "NO"
    add_speedups(rows, {m.name: m.backend for m in found if m.backend})
    return context, rows


def add_speedups(rows: list[dict], backends: dict[str, str]) -> None:
    """Speedups of each step over step 1, the step before it and each SDPA backend
    (`backends` maps an SDPA row's name to its backend)."""
    sdpa = {backends[r["optimization"]]: r["latency_ms"] for r in rows
            if r["step"] == measure.SDPA_STEP}
    steps = [r for r in rows if r["step"] != measure.SDPA_STEP]
    first = next((r for r in steps if r["step"] == 1), None)
    for previous, row in zip([None] + steps, steps):
        row["vs_step1"] = first["latency_ms"] / row["latency_ms"] if first else None
        row["vs_previous"] = previous["latency_ms"] / row["latency_ms"] if previous else None
        for backend, latency in sdpa.items():
            row[f"vs_sdpa_{backend}"] = latency / row["latency_ms"]


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The tutorial needs")):
        print(problem, file=sys.stderr)
        return 1
    context, rows = run(args)
    columns = columns_for(args.sdpa_backends, args.correctness_check)
    print(measure.format_context(context))
    print()
    print(measure.format_table(rows, columns))
    if args.json:
        measure.write_json(args.json, context, rows)
    if args.markdown:
        measure.write_markdown(args.markdown, "cuTile FMHA optimization tutorial", context,
                               rows, columns)
    failed = [r["step"] for r in rows if r.get("correct") == "NO"]
    if failed:
        print(f"\nIncorrect results from step(s) {failed}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
