"""Scaling analysis: every step and SDPA's backends across sequence lengths and head dims.

    python assets/fmha_scaling_analysis.py --iterations 100
    python assets/fmha_scaling_analysis.py --dtypes float16 bfloat16 --seq-lens 4096 8192 16384 \
        --steps 6 7 8 9                                      # the performance page's grid
    python assets/fmha_scaling_analysis.py --head-dim-sweep  # D 320-1024 against SDPA
                                                             # efficient, FFPA's shape

For each dtype, head dim, causal or not and N it times every method on the same fresh
inputs (FlashAttention-4 too where flash_attn.cute is importable, unless --no-fa4), gives
each step's speedup over SDPA's cuDNN backend, over the best SDPA backend and over FA4,
and measures the extra peak GPU memory of one call, SDPA's math backend included, so the
O(N) memory of the fused kernels stands next to the O(N^2) of the unfused one. Writes a
Markdown report, CSV, JSON and (with matplotlib) PNG plots to --output-dir.
"""

import argparse
import datetime
import itertools
import statistics
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import arch_of_capability, entry_for
from cutile_fmha.steps import steps_for

MIB = 1 << 20
CAUSAL_MODES = {"causal": [True], "non-causal": [False], "both": [True, False]}
COLUMNS = [
    Column("dtype", "dtype"), Column("head_dim", "D"), Column("heads", "H"),
    Column("causal", "causal"), Column("seq_len", "N"), Column("step", "step"),
    Column("method", "method"), Column("latency_ms", "latency (ms)", ".3f"),
    Column("tflops", "TFLOPS", ".1f"), Column("vs_cudnn", "vs SDPA cuDNN", ".2f"),
    Column("vs_efficient", "vs SDPA efficient", ".2f"),
    Column("vs_best_sdpa", "vs best SDPA", ".2f"), Column("vs_fa4", "vs FA4", ".2f"),
    Column("spread_pct", "spread of the rounds (%)", ".1f"),
    Column("extra_peak_mib", "extra peak memory (MiB)", ".1f"),
]
MATH_BACKEND = "math"
CUDNN_METHOD = "PyTorch SDPA (cudnn)"
EFFICIENT_METHOD = "PyTorch SDPA (efficient)"
# --head-dim-sweep: steps 10 and 11 at the head dims past 256 that models use, against SDPA's
# efficient backend (the only one that runs them on Hopper), at FFPA's shape B=1 H=48.
HEAD_DIM_SWEEP = {"head_dims": [320, 384, 448, 512, 576, 640, 768, 1024], "batch": 1,
                  "heads": 48, "seq_lens": [8192], "steps": [10, 11],
                  "sdpa_backends": ["efficient"]}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=measure.positive_int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--causal", choices=sorted(CAUSAL_MODES), default="both")
    measure.add_run_arguments(parser, sdpa_backends=["flash", "cudnn", "efficient"],
                              iterations_help="timed runs per point",
                              sdpa_help="SDPA backends to time (the math backend is measured "
                                        "for memory only)", sweep=True)
    parser.add_argument("--rounds", type=measure.positive_int, default=1,
                        help="time every method this many times at each point, in turn and "
                             "each round starting one method later, and keep the median (one "
                             "timing moves by up to 4%%)")
    parser.add_argument("--output-dir", type=Path,
                        default=Path("results") / f"scaling-{datetime.date.today()}")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    measure.add_fa4_argument(parser)
    parser.add_argument("--head-dim-sweep", action="store_true",
                        help="head dims on the x axis: the defaults become "
                             + ", ".join(f"--{key.replace('_', '-')} "
                                         + " ".join(map(str, value if isinstance(value, list)
                                                        else [value]))
                                         for key, value in HEAD_DIM_SWEEP.items())
                             + " (each still overridable), and the report and plots show "
                               "TFLOPS and the speedup over SDPA efficient against D")
    if parser.parse_known_args(argv)[0].head_dim_sweep:
        parser.set_defaults(**HEAD_DIM_SWEEP)
    args = parser.parse_args(argv)
    measure.check_run_arguments(parser, args)
    return args


def _peak_mib_or_oom(fn) -> float | str:
    try:
        return measure.extra_peak_memory(fn) / MIB
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    finally:
        torch.cuda.empty_cache()


def groups(args) -> list[tuple[str, int, bool]]:
    """(dtype, head dim, causal) of each table of the report, in the order they run."""
    return [(dtype, head_dim, causal) for dtype in args.dtypes for head_dim in args.head_dims
            for causal in CAUSAL_MODES[args.causal]]


def group_of(row: dict) -> tuple[str, int, bool]:
    return row["dtype"], row["head_dim"], row["causal"]


def sweep(args, save=lambda rows: None, fa4=None) -> list[dict]:
    """Every point's rows; `save(rows)` after each point, so that a run stopped early
    keeps what it measured. `fa4`: flash_attn.cute, timed with the others, or None."""
    shapes = [measure.Shape(args.batch, measure.heads_for(head_dim, args.heads), n, n, head_dim,
                            causal, dtype, args.kv_heads)
              for dtype, head_dim, causal in groups(args) for n in args.seq_lens]
    rows = []
    # Per point: each step that runs its head dim and each backend, every round; and
    # the math backend's memory.
    anchors = [] if fa4 is None else [measure.FA4_NAME]
    total = sum((len(steps_for(shape.head_dim, args.steps)) + len(args.sdpa_backends)
                 + len(anchors)) * args.rounds + 1 for shape in shapes)
    with tqdm(total=total, unit="run") as progress:
        for shape in shapes:
            progress.set_description(f"{shape.dtype} D={shape.head_dim} N={shape.q_len} "
                                     f"{'causal' if shape.causal else 'non-causal'}")
            q, k, v = measure.make_inputs(shape, seed=shape.q_len)
            found = measure.methods(q, k, v, causal=shape.causal, steps=args.steps,
                                    sdpa_backends=args.sdpa_backends, platform=args.platform,
                                    fa4=fa4)
            baselines = sum(m.step in (measure.SDPA_STEP, measure.ANCHOR_STEP) for m in found)
            progress.update((len(args.sdpa_backends) + len(anchors) - baselines)
                            * args.rounds)  # baselines that can't run here
            point_rows = [_method_row(shape, method) for method in found]
            timings = measure.time_in_rounds(
                found, args.rounds, lambda method: _time_or_oom(method.run, args.iterations),
                progress.update)
            for row, times in zip(point_rows, timings):
                if "OOM" in times:
                    row |= {"latency_ms": "OOM", "tflops": "OOM"}
                    continue
                latency = statistics.median(times)
                row |= {"latency_ms": latency, "tflops": measure.tflops(shape.flops, latency)}
                if len(times) > 1:
                    row["spread_pct"] = 100 * (max(times) - min(times)) / latency
            math_call = lambda: measure.sdpa(q, k, v, causal=shape.causal, backend=MATH_BACKEND)
            point_rows.append(_where(shape) | {"step": measure.SDPA_STEP,
                                               "method": "PyTorch SDPA (math)",
                                               "extra_peak_mib": _peak_mib_or_oom(math_call)})
            progress.update()
            add_speedups(point_rows)
            rows += point_rows
            save(rows)
            del q, k, v
    return rows


def _where(shape: measure.Shape) -> dict:
    return {"dtype": shape.dtype, "head_dim": shape.head_dim, "heads": shape.heads,
            "causal": shape.causal, "seq_len": shape.q_len}


def _method_row(shape: measure.Shape, method: measure.Method) -> dict:
    """A method's row at one point, with the extra peak memory of one call."""
    label = method.name if method.step in (measure.SDPA_STEP, measure.ANCHOR_STEP) else \
        f"step {method.step} {method.name}"
    return _where(shape) | {"step": method.step, "method": label,
                            "extra_peak_mib": _peak_mib_or_oom(method.run)}


def _time_or_oom(fn, iterations: int) -> float | str:
    try:
        return measure.time_ms(fn, iterations)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return "OOM"


def add_speedups(point_rows: list[dict]) -> None:
    """Each step's speedup over SDPA's cuDNN and efficient backends, over FlashAttention-4
    and over the best SDPA backend timed at the same point."""
    timed = [r for r in point_rows if isinstance(r.get("latency_ms"), float)]
    sdpa = {r["method"]: r["latency_ms"] for r in timed if r["step"] == measure.SDPA_STEP}
    anchors = {r["method"]: r["latency_ms"] for r in timed if r["step"] == measure.ANCHOR_STEP}
    for row in timed:
        if row["step"] in (measure.SDPA_STEP, measure.ANCHOR_STEP):
            continue
        for key, method, baselines in (("vs_cudnn", CUDNN_METHOD, sdpa),
                                       ("vs_efficient", EFFICIENT_METHOD, sdpa),
                                       ("vs_fa4", measure.FA4_NAME, anchors)):
            if method in baselines:
                row[key] = baselines[method] / row["latency_ms"]
        if sdpa:
            row["vs_best_sdpa"] = min(sdpa.values()) / row["latency_ms"]


def pivot(rows: list[dict], value: str, seq_lens: list[int], group: tuple,
          fmt: str) -> tuple[list[dict], list[Column]]:
    """One row per method, one column per N, for one (dtype, head dim, causal) group: the
    wide tables of the report."""
    rows = [r for r in rows if group_of(r) == group]
    table = []
    for method in dict.fromkeys(r["method"] for r in rows):
        line = {"method": method} | {f"n{r['seq_len']}": r[value] for r in rows
                                     if r["method"] == method and value in r}
        if len(line) > 1:
            table.append(line)
    return table, [Column("method", "method")] + [Column(f"n{n}", f"N={n}", fmt)
                                                   for n in seq_lens]


def best_steps(rows: list[dict], args) -> tuple[list[dict], list[Column]]:
    """Per group and N, the fastest step's speedup over SDPA cuDNN, with its number."""
    table = []
    for group in groups(args):
        dtype, head_dim, causal = group
        line = {"dtype": dtype, "head_dim": head_dim,
                "causal": "causal" if causal else "non-causal"}
        for n in args.seq_lens:
            steps = [r for r in rows if group_of(r) == group and r["seq_len"] == n
                     and "vs_cudnn" in r]
            if steps:
                best = max(steps, key=lambda r: r["vs_cudnn"])
                line[f"n{n}"] = f"{best['vs_cudnn']:.2f} (step {best['step']})"
        table.append(line)
    return table, [Column("dtype", "dtype"), Column("head_dim", "D"), Column("causal", "causal")] \
        + [Column(f"n{n}", f"N={n}") for n in args.seq_lens]


REPORT_TABLES = [("tflops", "TFLOPS", ".1f"),
                 ("vs_cudnn", "Speedup over SDPA cuDNN", ".2f"),
                 ("vs_best_sdpa", "Speedup over the best SDPA backend", ".2f"),
                 ("vs_fa4", "Speedup over FlashAttention-4", ".2f"),
                 ("extra_peak_mib", "Extra peak memory of one call (MiB)", ".1f"),
                 ("spread_pct", "Spread of the rounds (max - min, % of the median)", ".1f")]


def describe_group(group: tuple, args) -> str:
    dtype, head_dim, causal = group
    heads = measure.describe_heads(measure.heads_for(head_dim, args.heads), args.kv_heads)
    return f"{dtype}, D={head_dim}, {heads}, {'causal' if causal else 'non-causal'}"


def head_dim_sweep(rows: list[dict], args, dtype: str, causal: bool,
                   seq_len: int) -> tuple[list[dict], list[Column]]:
    """FFPA's table: one row per method (TFLOPS), the fastest step's speedup over SDPA
    efficient and its extra peak memory, one column per head dim."""
    rows = [r for r in rows if (r["dtype"], r["causal"], r["seq_len"]) == (dtype, causal, seq_len)]
    table = []
    for method in dict.fromkeys(r["method"] for r in rows if "tflops" in r):
        table.append({"what": f"{method} (TFLOPS)"} | {
            f"d{r['head_dim']}": measure.cell(r["tflops"], ".0f") for r in rows
            if r["method"] == method})
    fastest = {}
    for r in rows:
        if "vs_efficient" in r and r["vs_efficient"] > fastest.get(r["head_dim"], {}).get(
                "vs_efficient", 0):
            fastest[r["head_dim"]] = r
    for key, what, fmt in (("step", "fastest step", ""),
                           ("vs_efficient", "fastest step / SDPA efficient", ".2f"),
                           ("extra_peak_mib", "its extra peak memory (MiB)", ".0f")):
        table.append({"what": what} | {f"d{d}": measure.cell(r[key], fmt)
                                       for d, r in fastest.items()})
    return table, [Column("what", "")] + [Column(f"d{d}", f"D={d}") for d in args.head_dims]


def report(rows, args, context) -> str:
    """The Markdown report: the fastest step against cuDNN (or, sweeping head dims, FFPA's
    table against SDPA efficient), then one wide table per quantity for each dtype, head
    dim and causal mode."""
    lines = ["# cuTile FMHA scaling analysis", ""]
    lines += [f"- {key}: {value}" for key, value in context.items()]
    if args.head_dim_sweep:
        lines += ["", "## Head-dim sweep: the fastest step against SDPA efficient"]
        for dtype, causal, n in itertools.product(args.dtypes, CAUSAL_MODES[args.causal],
                                                  args.seq_lens):
            table, columns = head_dim_sweep(rows, args, dtype, causal, n)
            lines += ["", f"### {dtype}, {'causal' if causal else 'non-causal'}, N={n}", "",
                      measure.format_table(table, columns, "github")]
    else:
        table, columns = best_steps(rows, args)
        lines += ["", "## The fastest step against SDPA cuDNN", "",
                  measure.format_table(table, columns, "github")]
    for group in groups(args):
        lines += ["", f"## {describe_group(group, args)}"]
        for value, title, fmt in REPORT_TABLES:
            table, columns = pivot(rows, value, args.seq_lens, group, fmt)
            if table:
                lines += ["", f"### {title}", "", measure.format_table(table, columns, "github")]
    return "\n".join(lines) + "\n"


def _pyplot():
    """matplotlib's pyplot, drawing to files (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, figure, context, path: Path) -> Path:
    figure.suptitle(f"cuTile FMHA on {context['gpu']} ({context['arch']}), {context['shape']}")
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


PLOTS = [("tflops", "TFLOPS", "tflops_vs_seq_len.png"),
         ("vs_cudnn", "speedup over SDPA cuDNN (x)", "speedup_vs_cudnn.png")]


def plot(rows, args, context, output_dir: Path) -> list[Path]:
    """TFLOPS against N per method, and each step's speedup over SDPA cuDNN: one panel per
    dtype and head dim (rows) and causal mode (columns)."""
    plt = _pyplot()

    modes = CAUSAL_MODES[args.causal]
    panels = [(dtype, head_dim) for dtype in args.dtypes for head_dim in args.head_dims]
    # One color per method in every panel, so a step keeps its color across plots.
    colors = {name: f"C{i % 10}" for i, name in
              enumerate(dict.fromkeys(r["method"] for r in rows if "tflops" in r))}
    written = []
    for value, ylabel, name in PLOTS:
        figure, axes = plt.subplots(len(panels), len(modes), squeeze=False, layout="constrained",
                                    figsize=(7 * len(modes), 4.5 * len(panels)))
        for (dtype, head_dim), axes_row in zip(panels, axes):
            for axis, causal in zip(axes_row, modes):
                table, _ = pivot(rows, value, args.seq_lens, (dtype, head_dim, causal), "")
                for line in table:
                    points = [(n, line.get(f"n{n}")) for n in args.seq_lens]
                    points = [(n, y) for n, y in points if isinstance(y, float)]
                    if points:
                        axis.plot(*zip(*points), marker="o", label=line["method"],
                                  color=colors[line["method"]],
                                  linestyle="-" if line["method"].startswith("step") else "--")
                if value == "vs_cudnn":
                    axis.axhline(1.0, color="black", linewidth=1, linestyle=":")
                else:
                    axis.set_ylim(bottom=0)
                axis.set_xscale("log", base=2)
                axis.set_xticks(args.seq_lens, [str(n) for n in args.seq_lens])
                axis.set_xlabel("sequence length N")
                axis.set_ylabel(ylabel)
                axis.set_title(describe_group((dtype, head_dim, causal), args))
                axis.grid(True, alpha=0.3)
                if axis.get_legend_handles_labels()[0]:  # no cuDNN here: no speedups
                    axis.legend(fontsize=7)
        written.append(_save(plt, figure, context, output_dir / name))
    return written


HEAD_DIM_PLOTS = [("tflops", "TFLOPS", "tflops_vs_head_dim.png"),
                  ("vs_efficient", "speedup over SDPA efficient (x)", "speedup_vs_head_dim.png")]


def plot_head_dims(rows, args, context, output_dir: Path) -> list[Path]:
    """TFLOPS and the speedup over SDPA efficient against D: one panel per dtype (rows)
    and causal mode (columns), one line per method and N."""
    plt = _pyplot()

    modes = CAUSAL_MODES[args.causal]
    written = []
    for value, ylabel, name in HEAD_DIM_PLOTS:
        figure, axes = plt.subplots(len(args.dtypes), len(modes), squeeze=False,
                                    layout="constrained",
                                    figsize=(7 * len(modes), 4.5 * len(args.dtypes)))
        for dtype, axes_row in zip(args.dtypes, axes):
            for axis, causal in zip(axes_row, modes):
                lines = {}
                for r in rows:
                    if (r["dtype"], r["causal"]) == (dtype, causal) and \
                            isinstance(r.get(value), float):
                        label = f"{r['method']}, N={r['seq_len']}"
                        lines.setdefault(label, []).append((r["head_dim"], r[value]))
                for label, points in lines.items():
                    axis.plot(*zip(*sorted(points)), marker="o", label=label,
                              linestyle="--" if label.startswith("PyTorch") else "-")
                if value == "vs_efficient":
                    axis.axhline(2.0, color="black", linewidth=1, linestyle=":")
                axis.set_ylim(bottom=0)
                axis.set_xticks(args.head_dims, [str(d) for d in args.head_dims])
                axis.set_xlabel("head dim D")
                axis.set_ylabel(ylabel)
                axis.set_title(f"{dtype}, {'causal' if causal else 'non-causal'}")
                axis.grid(True, alpha=0.3)
                if lines:
                    axis.legend(fontsize=7)
        written.append(_save(plt, figure, context, output_dir / name))
    return written


def write_tables(rows, args, context) -> list[Path]:
    """scaling.json, scaling.csv and scaling.md: after every point, and at the end."""
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    measure.write_json(out / "scaling.json", context, rows)
    measure.write_csv(out / "scaling.csv", rows, COLUMNS)
    (out / "scaling.md").write_text(report(rows, args, context))
    return [out / "scaling.json", out / "scaling.csv", out / "scaling.md"]


def write_outputs(rows, args, context) -> list[Path]:
    """The tables and the plots."""
    out = args.output_dir
    written = write_tables(rows, args, context)
    if not args.no_plots:
        try:
            written += (plot_head_dims if args.head_dim_sweep else plot)(rows, args, context, out)
        except ImportError:
            print("matplotlib is not installed: no plots (pip install matplotlib)")
    return written


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The scaling analysis needs")):
        print(problem, file=sys.stderr)
        return 1
    arch = arch_of_capability(*torch.cuda.get_device_capability())
    context = measure.run_context(entry_for(args.platform or arch)) | {
        "shape": f"B={args.batch} {measure.describe_heads(args.heads, args.kv_heads)}",
        "command": " ".join(["python assets/fmha_scaling_analysis.py",
                             *(sys.argv[1:] if argv is None else argv)])}
    fa4 = measure.fa4_unless(args, context)
    rows = sweep(args, lambda rows: write_tables(rows, args, context), fa4)
    written = write_outputs(rows, args, context)
    print(report(rows, args, context))
    print("Wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
