"""Autotune this GPU's platform entry: the fastest launch per head dim, causal and not.

    python assets/fmha_autotune.py                      # D 64/128/256, causal and not
    python assets/fmha_autotune.py --head-dim 128 --seq-len 4096 --output my_entry.json

For each head dim and causal or not it times the final step at every candidate of this
architecture's search space (platforms/search_space.py: tile shape, occupancy,
num_worker_warps, num_ctas), after compiling them all in parallel and skipping those the
compiler rejects or that spill (a stack frame in cuobjdump's report). Then it times every
tuned step at the best launch, to find which step is fastest, and SDPA's cuDNN backend
beside them. It writes platforms/tuned/<arch>.json, which the launcher and the drop-in use
from then on, and prints the search's table.
"""

import argparse
import dataclasses
import multiprocessing
import re
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import HEAD_DIMS, TunedLaunch, arch_of_capability, entry_for
from cutile_fmha.platforms.environment import find_cuda_tool
from cutile_fmha.platforms.search_space import search_space_for
from cutile_fmha.platforms.tuned import tuned_path, write_tuned
from cutile_fmha.steps import FINAL_STEP, STEPS, plan_launch
from cutile_fmha.steps.compile import compile_step, resource_usage

TUNED_STEPS = [number for number, step in sorted(STEPS.items()) if step.launch == "tuned"]
COLUMNS = [Column("head_dim", "D"), Column("causal", "causal"), Column("step", "step"),
           Column("tiles", "tiles"), Column("occupancy", "occupancy"),
           Column("num_worker_warps", "worker warps"), Column("num_ctas", "CTAs"),
           Column("tflops", "TFLOPS", ".1f"), Column("vs_cudnn", "vs cuDNN", ".2f"),
           Column("skipped", "skipped")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, nargs="+", default=list(HEAD_DIMS),
                        choices=HEAD_DIMS)
    parser.add_argument("--seq-len", type=measure.positive_int, default=8192)
    parser.add_argument("--batch", type=measure.positive_int, default=4)
    parser.add_argument("--heads", type=measure.positive_int, default=None,
                        help="default: 32, or 16 for D=256 (about the same work per head dim)")
    parser.add_argument("--dtype", default="float16", choices=sorted(measure.DTYPES))
    parser.add_argument("--iterations", type=measure.positive_int, default=30,
                        help="timed runs per candidate")
    parser.add_argument("--workers", type=measure.positive_int, default=8,
                        help="processes compiling candidates in parallel")
    parser.add_argument("--output", help="where to write the entry (default: "
                                         "platforms/tuned/<arch>.json)")
    parser.add_argument("--markdown", metavar="PATH", help="write the search's table as Markdown")
    return parser.parse_args(argv)


def _entry_with(arch: str, head_dim: int, causal: bool, launch: TunedLaunch):
    """This architecture's entry with `launch` as its tuned launch for (head_dim, causal)."""
    entry = entry_for(arch)
    return dataclasses.replace(entry, tuned=entry.tuned | {(head_dim, causal): launch})


def check_candidate(job) -> str | None:
    """Compiles one candidate (the launch's JIT and the compile-only cubin); why it is
    skipped, or None. Runs in a worker process, so the compiles run side by side."""
    arch, head_dim, causal, launch, dtype = job
    entry = _entry_with(arch, head_dim, causal, launch)
    try:
        if find_cuda_tool("cuobjdump"):
            usage = resource_usage(compile_step(launch.step, arch, dtype=dtype, head_dim=head_dim,
                                                causal=causal, entry=entry))
            stack = re.search(r"STACK:(\d+)", usage)
            if stack and int(stack[1]):
                return f"spills (stack frame {stack[1]} bytes)"
        q, k, v = measure.make_inputs(measure.Shape(1, 2, 256, 256, head_dim, causal, dtype))
        plan_launch(q, k, v, causal=causal, step=launch.step, platform=entry).launch()
        torch.cuda.synchronize()
    except Exception as error:  # a candidate the compiler refuses is a result, not a crash
        return f"{type(error).__name__}: {str(error).splitlines()[0][:80] if str(error) else ''}"
    return None


def _time_launch(arch, shape, q, k, v, launch: TunedLaunch, iterations: int) -> float:
    entry = _entry_with(arch, shape.head_dim, shape.causal, launch)
    plan = plan_launch(q, k, v, causal=shape.causal, step=launch.step, platform=entry)
    return measure.tflops(shape.flops, measure.time_ms(plan.launch, iterations))


def describe(launch: TunedLaunch) -> str:
    return (f"step {launch.step}, {launch.tiles.tile_m}x{launch.tiles.tile_n}, occupancy "
            f"{launch.occupancy}, worker warps {launch.num_worker_warps or 'auto'}, CTAs "
            f"{launch.num_ctas or 'auto'}")


def search(args, arch: str, save) -> tuple[dict, list[dict]]:
    """(fastest launch per (head dim, causal), the search's rows); `save(best, rows)` after
    each point, so that an interrupted search keeps what it measured."""
    space = search_space_for(arch)
    points = [(d, c) for d in args.head_dim for c in (True, False)]
    jobs = [(arch, d, c, launch, args.dtype) for d, c in points for launch in space.launches(FINAL_STEP)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.workers) as pool:
        skipped = list(tqdm(pool.imap(check_candidate, jobs), total=len(jobs),
                            desc="compile candidates", unit="kernel"))
    rows, best = [], {}
    timed = tqdm(total=len(jobs) + len(points) * (len(TUNED_STEPS) + 1), desc="time", unit="run")
    for head_dim, causal in points:
        heads = args.heads or (16 if head_dim == 256 else 32)
        shape = measure.Shape(args.batch, heads, args.seq_len, args.seq_len, head_dim, causal,
                              args.dtype)
        q, k, v = measure.make_inputs(shape)
        cudnn = measure.tflops(shape.flops, measure.time_ms(
            lambda: measure.sdpa(q, k, v, causal=causal, backend="cudnn"), args.iterations))
        timed.update()
        point_rows = []
        for (_, d, c, launch, _), reason in zip(jobs, skipped):
            if (d, c) != (head_dim, causal):
                continue
            tflops = None if reason else _time_launch(arch, shape, q, k, v, launch,
                                                      args.iterations)
            point_rows.append(_row(head_dim, causal, launch, tflops, cudnn, reason))
            timed.update()
        fastest = max((r for r in point_rows if r["tflops"]), key=lambda r: r["tflops"])
        # Each tuned step at the fastest launch: which step is fastest here.
        step_rows = []
        for step in TUNED_STEPS:
            launch = dataclasses.replace(fastest["launch"], step=step)
            tflops = _time_launch(arch, shape, q, k, v, launch, args.iterations)
            step_rows.append(_row(head_dim, causal, launch, tflops, cudnn, None))
            timed.update()
        best[(head_dim, causal)] = max(step_rows, key=lambda r: r["tflops"])["launch"]
        tqdm.write(f"D={head_dim} {'causal' if causal else 'non-causal'}: cuDNN {cudnn:.0f}, "
                   f"best {describe(best[(head_dim, causal)])}: "
                   f"{max(r['tflops'] for r in step_rows):.0f} TFLOPS")
        rows += point_rows + step_rows
        save(best, rows)
        del q, k, v
    timed.close()
    return best, rows


def _row(head_dim, causal, launch: TunedLaunch, tflops, cudnn, skipped) -> dict:
    return {"head_dim": head_dim, "causal": causal, "step": launch.step,
            "tiles": f"{launch.tiles.tile_m}x{launch.tiles.tile_n}",
            "occupancy": launch.occupancy, "num_worker_warps": launch.num_worker_warps,
            "num_ctas": launch.num_ctas, "tflops": tflops, "cudnn_tflops": cudnn,
            "vs_cudnn": tflops / cudnn if tflops else None, "skipped": skipped, "launch": launch}


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The autotuner needs")):
        print(problem, file=sys.stderr)
        return 1
    arch = arch_of_capability(*torch.cuda.get_device_capability())
    context = measure.run_context() | {
        "shape": f"B={args.batch} N={args.seq_len} {args.dtype}, H=32 (16 at D=256)"}
    path = Path(args.output) if args.output else tuned_path(arch)

    def table(rows):
        return [{key: value for key, value in row.items() if key != "launch"} for row in rows]

    best, rows = search(args, arch, lambda best, rows: write_tuned(arch, context, best,
                                                                   table(rows), path=path))
    search_table = table(rows)
    print(measure.format_context(context))
    print(measure.format_table(search_table, COLUMNS))
    if args.markdown:
        measure.write_markdown(args.markdown, f"cuTile FMHA autotune, {arch}", context,
                               search_table, COLUMNS)
    print(f"Wrote {path}" + ("" if args.output else " (the launcher reads it from now on)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
