"""Run the tutorial and the scaling analysis for one platform; keep everything they write.

The per-platform scripts beside this file call it with their architecture:

    bash scripts/benchmark_hopper.sh            # H100 / H200, sm_90
    bash scripts/benchmark_dgx_spark.sh         # DGX Spark, sm_121
    bash scripts/benchmark_b300.sh              # B300, sm_103
    bash scripts/benchmark_generic.sh           # any GPU, with its own table entry

Results land in results/<platform>-<date>/ (ignored by git): the tutorial's table as
text, JSON and Markdown, and the scaling analysis' Markdown, CSV, JSON and plots.
Extra arguments go to both programs' shared options, e.g. --iterations 20.
"""

import argparse
import contextlib
import datetime
import sys
from pathlib import Path

import torch

from cutile_fmha.assets import fmha_optimization_tutorial as tutorial
from cutile_fmha.assets import fmha_scaling_analysis as scaling
from cutile_fmha.assets import measure
from cutile_fmha.platforms import arch_of_capability

ROOT = Path(__file__).resolve().parents[1]


class Tee:
    """Writes to the terminal and to a log file at once."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()


def architecture_warning(expected: str | None, actual: str, gpu: str) -> str | None:
    if expected is None or expected == actual:
        return None
    return (f"WARNING: this script is for {expected}, but this GPU is {gpu} ({actual}). "
            f"Running anyway with the {expected} table entry: the numbers show how that "
            f"entry does here, not what the {expected} GPU would do.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", help="table entry the script is for (default: this GPU's)")
    parser.add_argument("--label", required=True, help="name of the results folder")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--seq-lens", nargs="+", default=None, help="for the scaling analysis")
    args = parser.parse_args(argv)
    if (problem := measure.gpu_problem("The benchmarks need")):
        print(problem, file=sys.stderr)
        return 1
    arch = arch_of_capability(*torch.cuda.get_device_capability())
    if (warning := architecture_warning(args.platform, arch, torch.cuda.get_device_name())):
        print(warning, file=sys.stderr)
    out = ROOT / "results" / f"{args.label}-{datetime.date.today()}"
    out.mkdir(parents=True, exist_ok=True)
    platform = ["--platform", args.platform] if args.platform else []
    iterations = ["--iterations", str(args.iterations)]
    seq_lens = ["--seq-lens", *args.seq_lens] if args.seq_lens else []
    with open(out / "tutorial.txt", "w") as log, contextlib.redirect_stdout(Tee(sys.stdout, log)):
        if warning:
            print(warning)
        tutorial_status = tutorial.main(["--correctness-check", *platform, *iterations,
                                         "--json", str(out / "tutorial.json"),
                                         "--markdown", str(out / "tutorial.md")])
    with open(out / "scaling.txt", "w") as log, contextlib.redirect_stdout(Tee(sys.stdout, log)):
        scaling_status = scaling.main([*platform, *iterations, *seq_lens,
                                       "--output-dir", str(out)])
    print(f"Results in {out}")
    return tutorial_status or scaling_status


if __name__ == "__main__":
    sys.exit(main())
