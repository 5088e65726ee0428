"""Autotune this GPU's platform entry: the fastest launch per head dim, causal and not.

    python assets/fmha_autotune.py                      # D 64/128/256, causal and not
    python assets/fmha_autotune.py --head-dim 128 --seq-len 4096 --output my_entry.json
    python assets/fmha_autotune.py --head-dim 320 384 448 512 576 640 704 768 896 960 1024

For each head dim and causal or not it times every tuned step (7 on) at every candidate
of this architecture's search space (platforms/search_space.py: tile shape, occupancy,
num_worker_warps, num_ctas), after compiling them all in parallel and skipping those the
compiler rejects or that spill more than a few registers (cuobjdump's stack frame), with
SDPA's cuDNN backend in the same run. Each step is searched on its own: the best launch
of one step can be a poor one for another. The fastest few are timed twice more and the
best median wins. It writes platforms/tuned/<arch>.json, the fastest step and launch per
point, which the launcher and the drop-in use from then on, and prints the search's table.
The file's launches this search does not measure again (other head dims, other backward
kernels) stay in it with the run that measured them.

Head dims past 256 are searched on their own (all of --head-dim past 256, or none): steps
10 and 11 over their own candidates (platforms/search_space.py: tiles, head-dim chunk and
output slice), at FFPA's shape B=1 H=48 by default, against SDPA's efficient backend (the
one that runs them), written to platforms/tuned/<arch>-large-head-dims.json.

--varlen searches the variable-length forward (kernels/varlen.py: step 9's query tile over
packed sequences) over the same candidates as step 9, on --batch x --seq-len tokens of
sequences of lengths uniform in [256, --seq-len] (the variable-length benchmark's), against
SDPA's cuDNN backend on as many sequences of one length with the same FLOPs; it writes
platforms/tuned/<arch>-varlen.json, which the variable-length launcher reads.

--fp8 searches the FP8 forward (kernels/fp8.py: step 9's loop on float8_e4m3fn inputs) over
its own candidates (platforms/search_space.py, with the share of the exponentials computed on
the FMA pipes), at --batch x --seq-len, against SDPA's cuDNN backend in bfloat16 on the
same shape; it writes platforms/tuned/<arch>-fp8.json, which the FP8 launcher reads.

--decode searches the decode kernel (kernels/decode.py) per head dim: keys per tile and
occupancy, with the split rule (CTAs per SM, fewest keys per split) that cuts a cache
across CTAs, on one new token per sequence against dense caches of DECODE_WORKLOADS
(batch x keys: few sequences, where the split decides, and many), 32/8 heads. The
candidate with the smallest geometric mean of its times wins, its few nearest rivals timed
twice more; it writes platforms/tuned/<arch>-decode.json, which the decode launcher reads.

--backward searches the backward's launches per head dim (kernels/backward.py): its two
kernels, dK/dV (one CTA per key tile) and dQ (one per query tile), and "dkdv_dq", the dK/dV
kernel adding dQ itself, run alone: tile shape and worker warps. Each of the two kernels'
candidates is timed in the whole backward with the other kernel at this GPU's launch,
"dkdv_dq"'s in a backward of that kernel alone, causal and not, at --batch x --seq-len;
the smallest geometric mean of the two wins, its nearest rivals timed twice more, and the
two kernels at their launches are timed beside; the candidates are compiled first, in
parallel, as the forward's are. It writes
platforms/tuned/<arch>-backward.json, which the backward launcher reads: "dkdv_dq"'s tiles
and warps there replace the table's, whose rule of the calls it runs for is kept (and so
are the table's launches for exact head-dim pairs). --backward-kernels narrows the search.
"""

import argparse
import dataclasses
import functools
import json
import math
import multiprocessing
import re
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from cutile_fmha import attention_with_lse
from cutile_fmha.assets import measure
from cutile_fmha.assets.fmha_varlen_benchmark import sequence_lengths
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import (HEAD_DIMS, LARGE_HEAD_DIMS, DecodeLaunch, TileShape,
                                   TunedLaunch, arch_of_capability, entry_for)
from cutile_fmha.platforms.backward import (KERNELS, SEARCHED, BackwardLaunch,
                                            backward_entry_for, backward_record,
                                            describe_head_dims, head_dim_pair, is_exact_pair,
                                            with_launches)
from cutile_fmha.platforms.entry import DECODE_GUESS, PADDED_HEAD_DIM_MULTIPLE, launch_head_dim
from cutile_fmha.platforms.environment import find_cuda_tool
from cutile_fmha.platforms.search_space import (FP8_SEARCH_SPACE, LARGE_HEAD_DIM_SEARCH_SPACE,
                                                MAX_STACK_BYTES, search_space_for)
from cutile_fmha.platforms.tuned import runs_in, tuned_path, write_tuned
from cutile_fmha.steps import STEPS, plan_launch, steps_for
from cutile_fmha.steps.backward import attention_backward, launches_for
from cutile_fmha.steps.compile import compile_fp8, compile_step, compile_varlen, resource_usage
from cutile_fmha.steps.decode import DecodeShape, decode_forward
from cutile_fmha.steps.definitions import QUERY_TILE_STEP
from cutile_fmha.steps.family import ROWS_MULTIPLE
from cutile_fmha.steps.fp8 import fp8_forward
from cutile_fmha.steps.varlen import SequenceBounds, varlen_forward

FINALISTS = 3  # candidates timed again before one is picked
CONFIRM_ROUNDS = 2
TUNED_STEPS = [number for number, step in sorted(STEPS.items()) if step.launch == "tuned"]
LARGE_HEAD_DIM_SHAPE = {"batch": 1, "heads": 48}  # FFPA's
COLUMNS = [Column("head_dim", "D"), Column("causal", "causal"), Column("step", "step"),
           Column("tiles", "tiles"), Column("occupancy", "occupancy"),
           Column("num_worker_warps", "worker warps"), Column("num_ctas", "CTAs"),
           Column("tflops", "TFLOPS", ".1f"), Column("sdpa_backend", "SDPA"),
           Column("vs_sdpa", "vs SDPA", ".2f"),
           Column("median_tflops", f"median of {1 + CONFIRM_ROUNDS} (finalists)", ".1f"),
           Column("stack_bytes", "stack frame (bytes)"),
           Column("skipped", "skipped")]
# The FP8 forward's candidates also differ in their exponentials on the FMA pipes.
FP8_COLUMNS = COLUMNS[:7] + [Column("fma_exp2", "exponentials on FMA (1 in)")] + COLUMNS[7:]


def head_dim_argument(text: str) -> int | tuple[int, int]:
    """--head-dim's values: a head dim, or an exact pair D_QK/D_V."""
    try:
        return tuple(int(part) for part in text.split("/", 1)) if "/" in text else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a head dim or a pair D_QK/D_V, got {text!r}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=head_dim_argument, nargs="+", default=None,
                        metavar="D",
                        help=f"head dims to tune: {HEAD_DIMS}, or past 256 "
                             f"{LARGE_HEAD_DIMS}; with --backward also exact pairs D_QK/D_V "
                             f"(default: 64 128 256, and with --backward the table's pairs)")
    parser.add_argument("--seq-len", type=measure.positive_int, default=8192)
    parser.add_argument("--batch", type=measure.positive_int, default=None,
                        help="default 4, or 1 past D=256")
    parser.add_argument("--heads", type=measure.positive_int, default=None,
                        help="query heads (default: 32, 16 at D=256, 48 past it)")
    parser.add_argument("--dtype", default="float16", choices=sorted(measure.DTYPES))
    parser.add_argument("--iterations", type=measure.positive_int, default=30,
                        help="timed runs per candidate")
    parser.add_argument("--workers", type=measure.positive_int, default=8,
                        help="processes compiling candidates in parallel")
    parser.add_argument("--output", help="where to write the entry (default: "
                                         "platforms/tuned/<arch>.json, or past D=256 "
                                         "<arch>-large-head-dims.json)")
    parser.add_argument("--markdown", metavar="PATH", help="write the search's table as Markdown")
    parser.add_argument("--varlen", action="store_true",
                        help="tune the variable-length forward instead (head dims up to 256)")
    parser.add_argument("--fp8", action="store_true",
                        help="tune the FP8 forward instead (D 64/128/256)")
    parser.add_argument("--decode", action="store_true",
                        help="tune the decode kernel and its split rule instead (D 64/128/256)")
    parser.add_argument("--backward", action="store_true",
                        help="tune the backward's launches instead (D 64/128/256)")
    parser.add_argument("--backward-kernels", nargs="+", choices=SEARCHED, default=SEARCHED,
                        help="with --backward: the launches to search (default: all)")
    args = parser.parse_args(argv)
    if args.varlen + args.fp8 + args.decode + args.backward > 1:
        parser.error("--varlen, --fp8, --decode and --backward each search on their own")
    # With --backward and no --head-dim, the table's exact pairs follow (search_backward).
    args.table_pairs = args.backward and args.head_dim is None
    args.head_dim = args.head_dim or list(HEAD_DIMS)
    pairs = [d for d in args.head_dim if isinstance(d, tuple)]
    if pairs and not args.backward:
        parser.error("--head-dim: exact pairs D_QK/D_V are searched with --backward only")
    wrong = [describe_head_dims(pair) for pair in pairs if not is_exact_pair(pair)
             or any(d % PADDED_HEAD_DIM_MULTIPLE for d in pair)]
    if wrong:
        parser.error(f"--head-dim: a pair D_QK/D_V needs multiples of "
                     f"{PADDED_HEAD_DIM_MULTIPLE} up to {HEAD_DIMS[-1]}, not one of {HEAD_DIMS} "
                     f"twice (that is --head-dim D), got {wrong}")
    args.head_dim = [d for d in args.head_dim if not isinstance(d, tuple)] + pairs
    if set(args.head_dim) - set(HEAD_DIMS + LARGE_HEAD_DIMS) - set(pairs):
        parser.error(f"--head-dim: one of {HEAD_DIMS + LARGE_HEAD_DIMS}, got {args.head_dim}")
    if (args.fp8 or args.decode or args.backward) and set(args.head_dim) - set(HEAD_DIMS) \
            - set(pairs):
        parser.error(f"--fp8, --decode and --backward: head dims {HEAD_DIMS} only")
    # Which forward --head-dim's search times: the dense steps', or one kernel's.
    args.kernel = "varlen" if args.varlen else "fp8" if args.fp8 else "dense"
    args.large_head_dims = args.head_dim[0] in LARGE_HEAD_DIMS
    if any((d in LARGE_HEAD_DIMS) != args.large_head_dims for d in args.head_dim):
        parser.error("--head-dim: tune head dims up to 256 and past 256 in separate runs "
                     "(their launches go to separate files)")
    if args.varlen and args.large_head_dims:
        parser.error("--varlen: the variable-length launches are searched up to D=256 (past it "
                     "they take steps 10-11's)")
    if args.large_head_dims:
        args.batch = args.batch or LARGE_HEAD_DIM_SHAPE["batch"]
        args.heads = args.heads or LARGE_HEAD_DIM_SHAPE["heads"]
    args.batch = args.batch or 4
    return args


# The forward searched (args.kernel) -> the PlatformEntry field of its tuned launches.
TUNED_FIELDS = {"dense": "tuned", "varlen": "varlen_tuned", "fp8": "fp8_tuned"}


def _entry_with(arch: str, head_dim: int, causal: bool, launch: TunedLaunch, kernel: str):
    """This architecture's entry with `launch` as its tuned launch for (head_dim, causal),
    of the dense steps or of the `kernel` forward (TUNED_FIELDS)."""
    entry = entry_for(arch)
    field = TUNED_FIELDS[kernel]
    launches = getattr(entry, field) | {(head_dim, causal): launch}
    return dataclasses.replace(entry, **{field: launches})


@dataclasses.dataclass
class Workload:
    """What a candidate is timed on: dense (B, H, N, D) inputs, or a packed batch."""
    flops: float
    run: object  # run(entry, launch) -> a function of no arguments that launches once


def _dense_workload(shape) -> Workload:
    q, k, v = measure.make_inputs(shape)
    return Workload(shape.flops, lambda entry, launch: plan_launch(
        q, k, v, causal=shape.causal, step=launch.step, platform=entry).launch)


def _varlen_workload(lengths, heads, head_dim, causal, dtype) -> Workload:
    total = sum(lengths)
    q, k, v = (torch.randn(1, heads, total, head_dim, device="cuda", dtype=measure.DTYPES[dtype])
               for _ in range(3))
    cu_seqlens = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    bounds = SequenceBounds.packed(cu_seqlens, cu_seqlens)
    flops = sum(measure.attention_flops(1, heads, n, n, head_dim, causal) for n in lengths)
    return Workload(flops, lambda entry, launch: lambda: varlen_forward(
        q, k, v, bounds, max(lengths), causal=causal, scale=head_dim ** -0.5, with_lse=False,
        platform=entry))


def _fp8_workload(shape) -> Workload:
    from cutile_fmha import to_fp8

    (q, q_descale), (k, k_descale), (v_t, v_descale) = (
        to_fp8(t, transpose=index == 2) for index, t in enumerate(measure.make_inputs(shape)))
    return Workload(shape.flops, lambda entry, launch: lambda: fp8_forward(
        q, k, v_t, q_descale, k_descale, v_descale, causal=shape.causal,
        scale=shape.head_dim ** -0.5, with_lse=False, platform=entry))


def _workload(kernel: str, shape) -> Workload:
    """The dense steps' or the FP8 forward's workload on inputs of `shape`."""
    return _fp8_workload(shape) if kernel == "fp8" else _dense_workload(shape)


def point_workload(settings: dict, head_dim: int, causal: bool) -> tuple:
    """(shape, workload) of one search point: the shape the baseline runs and whose FLOPs
    count, and the workload its candidates run. `settings`: the search's batch, heads,
    seq_len, dtype, kernel and the variable-length forward's lengths."""
    heads = measure.heads_for(head_dim, settings["heads"])
    shape = measure.Shape(settings["batch"], heads, settings["seq_len"], settings["seq_len"],
                          head_dim, causal, settings["dtype"])
    if settings["kernel"] != "varlen":
        return shape, _workload(settings["kernel"], shape)
    lengths = settings["lengths"]
    # the baseline's shape: as many sequences of one length, with the same FLOPs
    same_work = round(math.sqrt(sum(n * n for n in lengths) / len(lengths)))
    shape = dataclasses.replace(shape, batch=len(lengths), q_len=same_work, k_len=same_work)
    return shape, _varlen_workload(lengths, heads, head_dim, causal, settings["dtype"])


def compile_candidates(check, jobs: list, workers: int) -> list:
    """check(job) of each job, in `workers` processes, so the compiles run side by side."""
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return list(tqdm(pool.imap(check, jobs), total=len(jobs), desc="compile candidates",
                         unit="kernel"))


def check_candidate(job) -> tuple[str | None, int | None]:
    """Compiles one candidate (the launch's JIT, by running it once on its point's workload,
    and the compile-only cubin): (why it is skipped or None, its stack frame in bytes or
    None without cuobjdump). Runs in a worker process, so the compiles run side by side;
    the JIT's kernels land in the kernel cache, where the timing finds them (on a smaller
    problem than the point's, it compiled kernels the point's did not find there)."""
    arch, head_dim, causal, launch, settings = job
    dtype, kernel = settings["dtype"], settings["kernel"]
    entry = _entry_with(arch, head_dim, causal, launch, kernel)
    stack_bytes = None
    try:
        if find_cuda_tool("cuobjdump"):
            options = dict(head_dim=head_dim, causal=causal, entry=entry)
            # the kernel the point's length runs (cuTile compiles one per divisibility)
            rows = ROWS_MULTIPLE if settings["seq_len"] % ROWS_MULTIPLE == 0 else 1
            cubin = compile_fp8(arch, rows_multiple=rows, **options) if kernel == "fp8" else \
                compile_varlen("fmha", arch, dtype=dtype, **options) if kernel == "varlen" \
                else compile_step(launch.step, arch, dtype=dtype, rows_multiple=rows, **options)
            stack_bytes = int(re.search(r"STACK:(\d+)", resource_usage(cubin))[1])
            if stack_bytes > MAX_STACK_BYTES:
                return f"spills (stack frame {stack_bytes} bytes)", stack_bytes
        _, workload = point_workload(settings, head_dim, causal)
        workload.run(entry, launch)()
        torch.cuda.synchronize()
    except Exception as error:  # a candidate the compiler refuses is a result, not a crash
        return measure.one_line(error, 80), stack_bytes
    return None, stack_bytes


def _time_launch(arch, head_dim, causal, workload: Workload, launch: TunedLaunch,
                 iterations: int, kernel: str) -> float:
    entry = _entry_with(arch, head_dim, causal, launch, kernel)
    return measure.tflops(workload.flops, measure.time_ms(workload.run(entry, launch),
                                                          iterations))


def describe(launch: TunedLaunch) -> str:
    return (f"step {launch.step}, {describe_tiles(launch.tiles)}, occupancy "
            f"{launch.occupancy}, worker warps {launch.num_worker_warps or 'auto'}, CTAs "
            f"{launch.num_ctas or 'auto'}"
            + (f", 1 exponential in {launch.fma_exp2} on the FMA pipes" if launch.fma_exp2
               else ""))


def candidates(arch: str, head_dim: int, kernel: str = "dense") -> list[TunedLaunch]:
    """Every launch to time at `head_dim`: each candidate of the search space with the
    tuned steps that run this head dim side by side, so that they meet the same clocks
    (the variable-length and FP8 forwards: step 9's candidates)."""
    steps = [QUERY_TILE_STEP] if kernel in ("varlen", "fp8") else \
        steps_for(head_dim, TUNED_STEPS)
    if head_dim in LARGE_HEAD_DIMS:
        launches = LARGE_HEAD_DIM_SEARCH_SPACE.launches(steps[0], head_dim)
    elif kernel == "fp8":
        launches = FP8_SEARCH_SPACE.launches(steps[0])
    else:
        launches = search_space_for(arch).launches(steps[0])
    return [dataclasses.replace(launch, step=step) for launch in launches for step in steps]


def fastest_finalist(rows: list[dict], score: str, retime, larger_is_better=False) -> dict:
    """The row whose `score` is best once the few best rows are timed again: one timing
    moves by up to 4%, so each of the FINALISTS best is retimed (`retime(row)` -> a new
    score) CONFIRM_ROUNDS more times, in turn, and the best median (`median_<score>`, set
    on each finalist) wins, so that one lucky timing does not pick the launch."""
    finalists = sorted(rows, key=lambda r: r[score], reverse=larger_is_better)[:FINALISTS]
    scores = [[r[score]] for r in finalists]
    for _ in range(CONFIRM_ROUNDS):
        for r, timings in zip(finalists, scores):
            timings.append(retime(r))
    for r, timings in zip(finalists, scores):
        r[f"median_{score}"] = statistics.median(timings)
    return (max if larger_is_better else min)(finalists, key=lambda r: r[f"median_{score}"])


def search(args, arch: str, save) -> tuple[dict, list[dict]]:
    """(fastest launch per (head dim, causal), the search's rows); `save(best, rows)` after
    each point, so that an interrupted search keeps what it measured."""
    points = [(d, c) for d in args.head_dim for c in (True, False)]
    settings = {key: getattr(args, key) for key in ("batch", "heads", "seq_len", "dtype",
                                                    "kernel")}
    settings["lengths"] = sequence_lengths(args.batch * args.seq_len, 256, args.seq_len, seed=0)
    jobs = [(arch, d, c, launch, settings) for d, c in points
            for launch in candidates(arch, d, args.kernel)]
    checked = compile_candidates(check_candidate, jobs, args.workers)
    rows, best = [], {}
    timed = tqdm(total=len(jobs) + len(points) * (1 + FINALISTS * CONFIRM_ROUNDS),
                 desc="time", unit="run")
    for head_dim, causal in points:
        shape, workload = point_workload(settings, head_dim, causal)
        q, k, v = measure.make_inputs(shape)
        # The baseline: cuDNN, or past D=256 the one SDPA backend that runs it.
        backend = "efficient" if args.large_head_dims else "cudnn"
        sdpa = measure.tflops(shape.flops, measure.time_ms(
            lambda: measure.sdpa(q, k, v, causal=causal, backend=backend), args.iterations))
        timed.update()
        point_rows = []
        for (_, d, c, launch, _), (reason, stack_bytes) in zip(jobs, checked):
            if (d, c) != (head_dim, causal):
                continue
            tflops = None if reason else _time_launch(arch, head_dim, causal, workload, launch,
                                                      args.iterations, args.kernel)
            point_rows.append(_row(head_dim, causal, launch, tflops, backend, sdpa, reason)
                              | {"stack_bytes": stack_bytes})
            timed.update()
        def retime(row):
            timed.update()
            return _time_launch(arch, head_dim, causal, workload, row["launch"],
                                args.iterations, args.kernel)

        fastest = fastest_finalist([r for r in point_rows if r["tflops"]], "tflops", retime,
                                   larger_is_better=True)
        best[(head_dim, causal)] = fastest["launch"]
        tqdm.write(f"D={head_dim} {'causal' if causal else 'non-causal'}: SDPA {backend} "
                   f"{sdpa:.0f}, best {describe(fastest['launch'])}: "
                   f"{fastest['median_tflops']:.0f} TFLOPS")
        rows += point_rows
        save(best, rows)
        del q, k, v, workload
    timed.close()
    return best, rows


# (batch, keys) the decode kernel is timed on, one new token each, 32/8 heads.
DECODE_WORKLOADS = ((1, 1024), (1, 4096), (1, 32768), (16, 4096), (64, 4096))
DECODE_HEADS = (32, 8)
DECODE_TILES = (64, 128, 256)
DECODE_OCCUPANCIES = (1, 2)
DECODE_SPLIT_RULES = ((1, 128), (1, 256), (1, 512), (2, 256))  # CTAs per SM, keys per split


DECODE_COLUMNS = [Column("head_dim", "D"), Column("tile_n", "keys per tile"),
                  Column("occupancy", "occupancy"), Column("ctas_per_sm", "CTAs per SM"),
                  Column("min_keys_per_split", "keys per split at least")] + [
    Column(f"b{batch}x{keys} us", f"B={batch} x {keys} (us)", ".1f")
    for batch, keys in DECODE_WORKLOADS] + [
    Column("geomean_us", "geometric mean (us)", ".2f"),
    Column("median_geomean_us", f"median of {1 + CONFIRM_ROUNDS} (finalists)", ".2f"),
    Column("skipped", "skipped")]


def decode_candidates(head_dim: int) -> list[DecodeLaunch]:
    """Every decode launch to time at `head_dim`: tiles of at most 32 KB of K (a tile of V
    as much again, double-buffered), each occupancy and split rule; what it does not
    search, DECODE_GUESS's."""
    return [dataclasses.replace(DECODE_GUESS[head_dim], tile_n=tile_n, occupancy=occupancy,
                                num_worker_warps=None, ctas_per_sm=ctas_per_sm,
                                min_keys_per_split=min_keys)
            for tile_n in DECODE_TILES if tile_n * head_dim * 2 <= 32 * 1024
            for occupancy in DECODE_OCCUPANCIES
            for ctas_per_sm, min_keys in DECODE_SPLIT_RULES]


def _decode_workloads(head_dim: int, dtype: str) -> list:
    """One function per DECODE_WORKLOADS case: f(launch) -> a function that launches once."""
    heads, kv_heads = DECODE_HEADS
    workloads = []
    for batch, keys in DECODE_WORKLOADS:
        query = torch.randn(batch, heads, 1, head_dim, device="cuda", dtype=measure.DTYPES[dtype])
        cache = [torch.randn(batch, kv_heads, keys, head_dim, device="cuda",
                             dtype=measure.DTYPES[dtype]) for _ in range(2)]
        shape = DecodeShape(batch=batch, head_dim=head_dim, kv_heads=kv_heads,
                            group=heads // kv_heads, q_len=1, capacity=keys, block_size=None,
                            causal=False, has_starts=False, has_lengths=False,
                            write_lse=False, num_splits=None)
        workloads.append(lambda launch, query=query, cache=cache, shape=shape: lambda: (
            decode_forward(query, *cache, shape, scale=head_dim ** -0.5, launch=launch)))
    return workloads


def _decode_times(workloads, launch: DecodeLaunch, iterations: int) -> list[float]:
    """Microseconds per workload."""
    return [measure.time_ms(workload(launch), iterations) * 1e3 for workload in workloads]


def search_decode(args, save) -> tuple[dict, list[dict]]:
    """(fastest decode launch per head dim, the search's rows); `save(best, rows)` after
    each head dim."""
    rows, best = [], {}
    for head_dim in args.head_dim:
        workloads = _decode_workloads(head_dim, args.dtype)
        point_rows = []
        for launch in tqdm(decode_candidates(head_dim), desc=f"decode D={head_dim}",
                           unit="launch"):
            try:
                times = _decode_times(workloads, launch, args.iterations)
            except Exception as error:  # a candidate the compiler refuses is a result
                point_rows.append({"head_dim": head_dim, **dataclasses.asdict(launch),
                                   "skipped": measure.one_line(error, 80)})
                continue
            point_rows.append({"head_dim": head_dim, **dataclasses.asdict(launch),
                               **_decode_columns(times), "launch": launch})
        fastest = fastest_finalist(
            [r for r in point_rows if "launch" in r], "geomean_us",
            lambda r: statistics.geometric_mean(_decode_times(workloads, r["launch"],
                                                              args.iterations)))
        best[head_dim] = fastest["launch"]
        tqdm.write(f"D={head_dim}: best {fastest['launch']}: geometric mean "
                   f"{fastest['median_geomean_us']:.1f} us")
        rows += point_rows
        save(best, rows)
    return best, rows


def _decode_columns(times: list[float]) -> dict:
    return {f"b{batch}x{keys} us": round(t, 2) for (batch, keys), t in
            zip(DECODE_WORKLOADS, times)} | {"geomean_us": statistics.geometric_mean(times)}


# (TILE_M, TILE_N): 32x128 is D=128's dK/dV, 128x32 D=256's dQ on sm_90; 16x128 for
# narrow V (192/128), whose registers leave room for few query rows of wide Q and K
BACKWARD_TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (32, 128), (128, 32), (16, 128))
BACKWARD_WORKER_WARPS = (4, 8, None)  # None: the compiler's choice
BACKWARD_COLUMNS = [Column("head_dim", "D"), Column("kernel", "kernel"),
                    Column("tiles", "tiles"), Column("num_worker_warps", "worker warps"),
                    Column("dq_late", "dQ one turn late"),
                    Column("causal_ms", "causal (ms)", ".3f"),
                    Column("non_causal_ms", "non-causal (ms)", ".3f"),
                    Column("geomean_ms", "geometric mean (ms)", ".3f"),
                    Column("median_geomean_ms", f"median of {1 + CONFIRM_ROUNDS} (finalists)",
                           ".3f"),
                    Column("skipped", "skipped")]


def backward_candidates(kernels=SEARCHED) -> list[tuple[str, BackwardLaunch]]:
    """Every (kernel, launch) to time: each tile shape and worker-warps count, per kernel,
    and for "dkdv_dq" its dQ added on time and one turn late (the ones the compiler
    refuses, or that run out of shared memory, are skipped then)."""
    return [(kernel, BackwardLaunch(TileShape(tile_m, tile_n), warps, dq_late=late))
            for kernel in kernels for tile_m, tile_n in BACKWARD_TILES
            for warps in BACKWARD_WORKER_WARPS
            for late in ((False, True) if kernel == "dkdv_dq" else (False,))]


def _backward_workloads(args, head_dims) -> list:
    """Causal and not: f(entry) -> a function that runs the whole backward once, at a head
    dim or an exact pair (D_qk, D_v), with --heads or the default of its launch head dim."""
    q_head_dim, v_head_dim = head_dim_pair(head_dims)
    workloads = []
    for causal in (True, False):
        shape = measure.Shape(args.batch, measure.heads_for(launch_head_dim(
            q_head_dim, v_head_dim), args.heads), args.seq_len, args.seq_len, q_head_dim,
            causal, args.dtype)
        q, k, v = measure.make_inputs(shape)
        if v_head_dim != q_head_dim:
            v = torch.randn(*v.shape[:-1], v_head_dim, device=v.device, dtype=v.dtype)
        out, lse = attention_with_lse(q, k, v, is_causal=causal)
        grad_out = torch.randn_like(out)
        workloads.append(lambda entry, tensors=(q, k, v, out, lse, grad_out), causal=causal:
                         lambda: attention_backward(*tensors, causal=causal, entry=entry))
    return workloads


@functools.cache
def backward_search_entries(arch: str) -> tuple:
    """(the two kernels, never "dkdv_dq"; "dkdv_dq" alone, for every call): this GPU's
    backward launches over which each kernel's candidates are timed."""
    entry = backward_entry_for(arch)

    def without_dkdv_dq(launches):
        return {kernel: launch for kernel, launch in launches.items() if kernel in KERNELS}

    def for_every_call(launches):  # "dkdv_dq" alone
        return {kernel: dataclasses.replace(launch, only_with=None)
                for kernel, launch in launches.items() if kernel == "dkdv_dq"}

    two = dataclasses.replace(entry, launches={
        head_dim: without_dkdv_dq(kernels) for head_dim, kernels in entry.launches.items()},
        exact_launches={pair: without_dkdv_dq(kernels)
                        for pair, kernels in entry.exact_launches.items()})
    # "dkdv_dq"'s candidates replace this launch's tiles and warps
    alone = dataclasses.replace(two, launches={
        head_dim: two.launches[head_dim] | for_every_call(kernels)
        for head_dim, kernels in entry.launches.items()},
        exact_launches={pair: two.exact_launches[pair] | for_every_call(kernels)
                        for pair, kernels in entry.exact_launches.items()})
    return two, alone


def backward_candidate_entry(arch: str, head_dims, kernel: str, launch: BackwardLaunch):
    """This GPU's backward launches with `launch` as `kernel`'s at `head_dims`: the two
    kernels', or "dkdv_dq"'s running alone."""
    two, alone = backward_search_entries(arch)
    return with_launches(two if kernel in KERNELS else alone, {(head_dims, kernel): launch},
                         "a candidate")


def check_backward_candidate(job) -> str | None:
    """Compiles one backward candidate by running it once, causal and not, on the search's
    problem (the launch's JIT fills the kernel cache that the timing then reads; on a
    smaller one, batch 1 and 256 rows, it compiled kernels the search's shape did not
    find there): why it is skipped, or None. Runs in a worker process, so the compiles run
    side by side (at D=256 one takes 10-40 s)."""
    arch, head_dims, kernel, launch, shape = job
    try:
        entry = backward_candidate_entry(arch, head_dims, kernel, launch)
        for workload in _backward_workloads(argparse.Namespace(**shape), head_dims):
            workload(entry)()
        torch.cuda.synchronize()
    except Exception as error:  # a candidate the compiler refuses is a result, not a crash
        return measure.one_line(error, 80)
    return None


def search_backward(args, arch: str, save) -> tuple[dict, list[dict]]:
    """(fastest launch per (head dim or exact pair, kernel), the search's rows); `save(best,
    rows)` after each head dim."""
    rows, best = [], {}
    two, alone = backward_search_entries(arch)
    points = args.head_dim + (list(backward_entry_for(arch).exact_launches)
                              if args.table_pairs else [])
    searched = {}  # head dims -> the kernels searched there
    for head_dims in points:
        has_dkdv_dq = "dkdv_dq" in launches_for(alone, *head_dim_pair(head_dims))
        searched[head_dims] = [kernel for kernel in args.backward_kernels
                               if kernel in KERNELS or has_dkdv_dq]
        if searched[head_dims] != list(args.backward_kernels):
            tqdm.write(f"D={describe_head_dims(head_dims)}: the table has no 'dkdv_dq' launch "
                       f"to retile here")
    shape = {key: getattr(args, key) for key in ("batch", "heads", "seq_len", "dtype")}
    jobs = [(arch, head_dims, kernel, launch, shape) for head_dims in points
            for kernel, launch in backward_candidates(searched[head_dims])]
    skipped = dict(zip([job[1:4] for job in jobs],
                       compile_candidates(check_backward_candidate, jobs, args.workers)))
    for head_dims in points:
        name = describe_head_dims(head_dims)
        label = name if isinstance(head_dims, tuple) else head_dims  # the table's D column
        workloads = _backward_workloads(args, head_dims)

        def times(kernel, launch):
            entry = backward_candidate_entry(arch, head_dims, kernel, launch)
            return [measure.time_ms(workload(entry), args.iterations) for workload in workloads]

        def row_of(kernel, tiles, warps, causal_ms, non_causal_ms, **more):
            return {"head_dim": label, "kernel": kernel, "tiles": tiles,
                    "num_worker_warps": warps, "causal_ms": causal_ms,
                    "non_causal_ms": non_causal_ms,
                    "geomean_ms": math.sqrt(causal_ms * non_causal_ms), **more}

        # the two kernels at this GPU's launches, beside which "dkdv_dq" is read
        two_ms = [measure.time_ms(workload(two), args.iterations) for workload in workloads]
        point_rows = [row_of("dkdv + dq", "the table's", None, *two_ms)]
        for kernel, launch in tqdm(backward_candidates(searched[head_dims]),
                                   desc=f"backward D={name}", unit="launch"):
            row = {"head_dim": label, "kernel": kernel, "tiles": describe_tiles(launch.tiles),
                   "num_worker_warps": launch.num_worker_warps,
                   "dq_late": launch.dq_late if kernel == "dkdv_dq" else None}
            reason = skipped[(head_dims, kernel, launch)]
            if reason is None:
                try:
                    causal_ms, non_causal_ms = times(kernel, launch)
                except Exception as error:  # a failure the compile pass did not meet
                    reason = measure.one_line(error, 80)
            if reason:
                point_rows.append(row | {"skipped": reason})
                continue
            point_rows.append(row_of(kernel, row["tiles"], launch.num_worker_warps, causal_ms,
                                     non_causal_ms, dq_late=row["dq_late"], launch=launch))
        for kernel in searched[head_dims]:
            timed = [r for r in point_rows if r["kernel"] == kernel and "launch" in r]
            if not timed:
                tqdm.write(f"D={name} {kernel}: every candidate was skipped; the table's "
                           f"launch stays")
                continue
            fastest = fastest_finalist(
                timed, "geomean_ms",
                lambda r, kernel=kernel: statistics.geometric_mean(times(kernel, r["launch"])))
            best[(head_dims, kernel)] = fastest["launch"]
            late = ", dQ one turn late" if fastest["dq_late"] else ""
            tqdm.write(f"D={name} {kernel}: best {fastest['tiles']}, worker warps "
                       f"{fastest['num_worker_warps'] or 'auto'}{late}: "
                       f"{fastest['median_geomean_ms']:.3f} ms (geometric mean; the two "
                       f"kernels at the table's launches: {point_rows[0]['geomean_ms']:.3f})")
        rows += point_rows
        save(best, rows)
    return best, rows


def describe_tiles(tiles) -> str:
    """"128x64", or for steps 10-11's tiles "64x128, chunk 64, slice 512"."""
    text = f"{tiles.tile_m}x{tiles.tile_n}"
    return text + (f", chunk {tiles.tile_k}, slice {tiles.tile_v}" if tiles.tile_k else "")


def _row(head_dim, causal, launch: TunedLaunch, tflops, backend, sdpa, skipped) -> dict:
    return {"head_dim": head_dim, "causal": causal, "step": launch.step,
            "tiles": describe_tiles(launch.tiles),
            "occupancy": launch.occupancy, "num_worker_warps": launch.num_worker_warps,
            "num_ctas": launch.num_ctas, "tflops": tflops, "sdpa_backend": backend,
            "sdpa_tflops": sdpa, "vs_sdpa": tflops / sdpa if tflops else None,
            "skipped": skipped, "launch": launch} | (
                {"fma_exp2": launch.fma_exp2} if launch.fma_exp2 else {})


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The autotuner needs")):
        print(problem, file=sys.stderr)
        return 1
    arch = arch_of_capability(*torch.cuda.get_device_capability())
    shape = f"{args.batch * args.seq_len} tokens of sequences of 256-{args.seq_len} tokens" \
        if args.varlen else f"B={args.batch} N={args.seq_len}"
    if args.fp8:
        shape = f"float8_e4m3fn against SDPA cuDNN in {args.dtype}, B={args.batch} " \
                f"N={args.seq_len}"
    if args.decode:
        shape = "one token per sequence, dense caches of (batch, keys) " + \
            ", ".join(f"{b}x{n}" for b, n in DECODE_WORKLOADS) + \
            f", {DECODE_HEADS[0]}/{DECODE_HEADS[1]} heads"
    if args.backward:
        shape = f"backward, causal and not, B={args.batch} N={args.seq_len}"
    heads = "" if args.decode else f", {measure.describe_heads(args.heads, None)}" + (
        " (a pair D_QK/D_V: its launch head dim's)" if args.backward and not args.heads else "")
    context = measure.run_context() | {"shape": f"{shape} {args.dtype}{heads}"}
    path = Path(args.output) if args.output else tuned_path(
        arch, args.large_head_dims, args.varlen, args.decode, args.backward, args.fp8)

    def table(rows):
        return [{key: value for key, value in row.items() if key != "launch"} for row in rows]

    earlier = runs_in(path, arch)  # what this search does not measure again stays

    def save(best, rows):
        write_tuned(arch, context, best, table(rows), path=path,
                    record=backward_record if args.backward else None, earlier=earlier)

    if args.decode:
        best, rows = search_decode(args, save)
    elif args.backward:
        best, rows = search_backward(args, arch, save)
    else:
        best, rows = search(args, arch, save)
    search_table = table(rows)
    columns = DECODE_COLUMNS if args.decode else BACKWARD_COLUMNS if args.backward else \
        FP8_COLUMNS if args.fp8 else COLUMNS
    print(measure.format_context(context))
    print(measure.format_table(search_table, columns))
    if args.markdown:
        measure.write_markdown(args.markdown, f"cuTile FMHA autotune, {arch}", context,
                               search_table, columns)
    kept = json.loads(path.read_text()).get("earlier", []) if path.exists() else []
    print(f"Wrote {path}" + ("" if args.output else " (the launcher reads it from now on)") +
          "".join(f"; kept {len(run['launches'])} launches of the run of {run['measured']['date']}"
                  for run in kept))
    return 0


if __name__ == "__main__":
    sys.exit(main())
