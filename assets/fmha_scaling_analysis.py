"""Scaling analysis: every step and SDPA's backends across sequence lengths.

    python assets/fmha_scaling_analysis.py --iterations 100

For each N (and causal and not) it times every method on the same fresh inputs and
measures the extra peak GPU memory of one call, SDPA's math backend included, so the
O(N) memory of the fused kernels stands next to the O(N^2) of the unfused one. Writes
a Markdown report, CSV, JSON and (with matplotlib) PNG plots to --output-dir.
"""

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import torch

from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import arch_of_capability, entry_for

MIB = 1 << 20
CAUSAL_MODES = {"causal": [True], "non-causal": [False], "both": [True, False]}
COLUMNS = [
    Column("causal", "causal"), Column("seq_len", "N"), Column("step", "step"),
    Column("method", "method"), Column("latency_ms", "latency (ms)", ".3f"),
    Column("tflops", "TFLOPS", ".1f"), Column("vs_best_sdpa", "vs best SDPA", ".2f"),
    Column("extra_peak_mib", "extra peak memory (MiB)", ".1f"),
]
MATH_BACKEND = "math"


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=measure.positive_int, nargs="+",
                        default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--causal", choices=sorted(CAUSAL_MODES), default="both")
    measure.add_run_arguments(parser, sdpa_backends=["flash", "cudnn", "efficient"],
                              iterations_help="timed runs per point",
                              sdpa_help="SDPA backends to time (the math backend is measured "
                                        "for memory only)")
    parser.add_argument("--output-dir", type=Path,
                        default=Path("results") / f"scaling-{datetime.date.today()}")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    args = parser.parse_args(argv)
    measure.check_run_arguments(parser, args)
    return args


class Progress:
    """Prints which point is running, how many are left and the estimated time left.

    A point costs a fixed part (compile, warm-up, graph capture) plus a part that grows
    with its FLOPs, so the estimate fits seconds = a + b * work to the finished points."""

    def __init__(self, works: list[float]):
        self.works = list(works)  # the work of every point, in the order they run
        self.started = 0
        self.seconds: list[float] = []  # time each finished point took
        self.last_start: float | None = None

    def point(self, label: str) -> None:
        now = time.perf_counter()
        if self.last_start is not None:
            self.seconds.append(now - self.last_start)
        self.last_start = now
        self.started += 1
        left = f", about {self._seconds_left():.0f}s left" if self.seconds else ""
        print(f"[{self.started}/{len(self.works)}] {label}{left}", flush=True)

    def skip(self, count: int) -> None:
        """The next `count` points will not run."""
        del self.works[self.started:self.started + count]

    def _seconds_left(self) -> float:
        done, remaining = self.works[:len(self.seconds)], self.works[len(self.seconds):]
        mean_work, mean_seconds = statistics.mean(done), statistics.mean(self.seconds)
        spread = sum((w - mean_work) ** 2 for w in done)
        slope = max(0.0, sum((w - mean_work) * (t - mean_seconds)
                             for w, t in zip(done, self.seconds)) / spread) if spread else 0.0
        fixed = max(0.0, mean_seconds - slope * mean_work)
        return sum(fixed + slope * work for work in remaining)


def _peak_mib_or_oom(fn) -> float | str:
    try:
        return measure.extra_peak_memory(fn) / MIB
    except torch.cuda.OutOfMemoryError:
        return "OOM"
    finally:
        torch.cuda.empty_cache()


def sweep(args) -> list[dict]:
    shapes = [measure.Shape(args.batch, args.heads, n, n, args.head_dim, causal, args.dtype,
                            args.kv_heads)
              for causal in CAUSAL_MODES[args.causal] for n in args.seq_lens]
    per_point = len(args.steps) + len(args.sdpa_backends) + 1  # + the math backend
    progress = Progress([shape.flops for shape in shapes for _ in range(per_point)])
    rows = []
    for shape in shapes:
        causal, seq_len = shape.causal, shape.q_len
        q, k, v = measure.make_inputs(shape, seed=seq_len)
        found = measure.methods(q, k, v, causal=causal, steps=args.steps,
                                sdpa_backends=args.sdpa_backends, platform=args.platform)
        point_rows = []
        for method in found:
            progress.point(f"{method.name}, N={seq_len}, {'causal' if causal else 'non-causal'}")
            label = method.name if method.step == measure.SDPA_STEP else \
                f"step {method.step} {method.name}"
            row = {"causal": causal, "seq_len": seq_len, "step": method.step, "method": label,
                   "extra_peak_mib": _peak_mib_or_oom(method.run)}
            try:
                latency = measure.time_ms(method.run, args.iterations)
                row |= {"latency_ms": latency, "tflops": measure.tflops(shape.flops, latency)}
            except torch.cuda.OutOfMemoryError:
                row |= {"latency_ms": "OOM", "tflops": "OOM"}
                torch.cuda.empty_cache()
            point_rows.append(row)
        progress.skip(per_point - 1 - len(found))  # backends that can't run here
        progress.point(f"SDPA math (memory only), N={seq_len}")
        math_call = lambda: measure.sdpa(q, k, v, causal=causal, backend=MATH_BACKEND)
        point_rows.append({"causal": causal, "seq_len": seq_len, "step": measure.SDPA_STEP,
                           "method": "PyTorch SDPA (math)",
                           "extra_peak_mib": _peak_mib_or_oom(math_call)})
        sdpa_latencies = [r["latency_ms"] for r in point_rows
                          if r["step"] == measure.SDPA_STEP
                          and isinstance(r.get("latency_ms"), float)]
        for row in point_rows:
            if (row["step"] != measure.SDPA_STEP and sdpa_latencies
                    and isinstance(row.get("latency_ms"), float)):
                row["vs_best_sdpa"] = min(sdpa_latencies) / row["latency_ms"]
        rows += point_rows
    return rows


def pivot(rows: list[dict], value: str, seq_lens: list[int], causal: bool,
          fmt: str) -> tuple[list[dict], list[Column]]:
    """One row per method, one column per N: the wide tables of the report."""
    methods = list(dict.fromkeys(r["method"] for r in rows if r["causal"] == causal))
    table = []
    for method in methods:
        line = {"method": method}
        for r in rows:
            if r["method"] == method and r["causal"] == causal and value in r:
                line[f"n{r['seq_len']}"] = r[value]
        if len(line) > 1:
            table.append(line)
    return table, [Column("method", "method")] + [Column(f"n{n}", f"N={n}", fmt)
                                                   for n in seq_lens]


REPORT_TABLES = [("tflops", "TFLOPS", ".1f"),
                 ("vs_best_sdpa", "Speedup over the best SDPA backend", ".2f"),
                 ("extra_peak_mib", "Extra peak memory of one call (MiB)", ".1f")]


def report(rows, args, context) -> str:
    """The Markdown report: one wide table per quantity and causal mode."""
    lines = ["# cuTile FMHA scaling analysis", ""]
    lines += [f"- {key}: {value}" for key, value in context.items()]
    for causal in CAUSAL_MODES[args.causal]:
        for value, title, fmt in REPORT_TABLES:
            table, columns = pivot(rows, value, args.seq_lens, causal, fmt)
            lines += ["", f"## {title}, {'causal' if causal else 'non-causal'}", "",
                      measure.format_table(table, columns, "github")]
    return "\n".join(lines) + "\n"


def plot(rows, args, context, output_dir: Path) -> list[Path]:
    """TFLOPS against N per method, and each step's speedup over the best SDPA backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = CAUSAL_MODES[args.causal]
    # One color per method in both figures, so a step keeps its color across plots.
    colors = {name: f"C{i % 10}" for i, name in
              enumerate(dict.fromkeys(r["method"] for r in rows if "tflops" in r))}
    written = []
    for value, ylabel, name in (("tflops", "TFLOPS", "tflops_vs_seq_len.png"),
                                ("vs_best_sdpa", "speedup over the best SDPA backend (x)",
                                 "speedup_vs_sdpa.png")):
        figure, axes = plt.subplots(1, len(modes), figsize=(7 * len(modes), 5), squeeze=False)
        for axis, causal in zip(axes[0], modes):
            table, _ = pivot(rows, value, args.seq_lens, causal, "")
            for line in table:
                points = [(n, line.get(f"n{n}")) for n in args.seq_lens]
                points = [(n, y) for n, y in points if isinstance(y, float)]
                if points:
                    axis.plot(*zip(*points), marker="o", label=line["method"],
                              color=colors[line["method"]],
                              linestyle="--" if line["method"].startswith("PyTorch") else "-")
            axis.set_ylim(bottom=0)
            if value == "vs_best_sdpa":
                axis.axhline(1.0, color="black", linewidth=1, linestyle=":")
                axis.set_ylim(top=max(1.2, axis.get_ylim()[1]))
            axis.set_xscale("log", base=2)
            axis.set_xticks(args.seq_lens, [str(n) for n in args.seq_lens])
            axis.set_xlabel("sequence length N")
            axis.set_ylabel(ylabel)
            axis.set_title("causal" if causal else "non-causal")
            axis.grid(True, alpha=0.3)
            axis.legend(fontsize=8)
        figure.suptitle(f"cuTile FMHA on {context['gpu']} ({context['arch']}): "
                        f"{context['shape']}")
        figure.tight_layout()
        path = output_dir / name
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


def write_outputs(rows, args, context) -> list[Path]:
    out = args.output_dir
    out.mkdir(parents=True, exist_ok=True)
    measure.write_json(out / "scaling.json", context, rows)
    measure.write_csv(out / "scaling.csv", rows, COLUMNS)
    (out / "scaling.md").write_text(report(rows, args, context))
    written = [out / "scaling.json", out / "scaling.csv", out / "scaling.md"]
    if not args.no_plots:
        try:
            written += plot(rows, args, context, out)
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
        "shape": f"B={args.batch} {measure.describe_heads(args.heads, args.kv_heads)} "
                 f"D={args.head_dim} {args.dtype}"}
    rows = sweep(args)
    written = write_outputs(rows, args, context)
    print(report(rows, args, context))
    print("Wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
