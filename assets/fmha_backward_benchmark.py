"""Backward benchmark: the cuTile backward against SDPA's backends' backward passes.

    python assets/fmha_backward_benchmark.py
    python assets/fmha_backward_benchmark.py --dtypes float16 bfloat16 --rounds 3

For each dtype, causal or not and N it runs one forward per method with inputs that
require grad, then times ``out.backward(grad_out, retain_graph=True)`` alone (triton's
do_bench, median; the gradients reset before each call), every method in turn per round,
each round starting one method later, and keeps the median of the rounds. Backward
TFLOPS count 2.5x the forward's FLOPs. Writes the table as JSON and Markdown with
--json / --markdown.
"""

import argparse
import statistics
import sys

import torch
from tqdm import tqdm

from cutile_fmha import attention
from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import HEAD_DIMS

BACKWARD_FLOPS_PER_FORWARD = 2.5  # two matrix products forward, five backward
CUTILE = "cuTile"
COLUMNS = [Column("dtype", "dtype"), Column("causal", "causal"), Column("seq_len", "N"),
           Column("method", "method"), Column("latency_ms", "backward (ms)", ".3f"),
           Column("tflops", "TFLOPS", ".1f"), Column("vs_flash", "vs SDPA flash", ".2f"),
           Column("vs_cudnn", "vs SDPA cuDNN", ".2f")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=measure.positive_int, nargs="+",
                        default=[4096, 8192, 16384])
    parser.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"],
                        choices=sorted(measure.DTYPES))
    parser.add_argument("--head-dim", type=int, default=128, choices=HEAD_DIMS)
    parser.add_argument("--batch", type=measure.positive_int, default=4)
    parser.add_argument("--heads", type=measure.positive_int, default=None,
                        help="query heads (default: 32, or 16 at D=256)")
    parser.add_argument("--sdpa-backends", nargs="+", default=["flash", "cudnn"],
                        choices=measure.TIMED_SDPA_BACKENDS)
    parser.add_argument("--rounds", type=measure.positive_int, default=1)
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--markdown", metavar="PATH")
    return parser.parse_args(argv)


def time_backward_ms(forward, inputs, grad_out) -> float:
    """Median milliseconds of the backward of one `forward()` call."""
    from triton.testing import do_bench

    out = forward()
    return do_bench(lambda: out.backward(grad_out, retain_graph=True), warmup=50, rep=300,
                    grad_to_none=list(inputs), return_mode="median")


def run(args) -> list[dict]:
    points = [(dtype, causal, n) for dtype in args.dtypes for causal in (True, False)
              for n in args.seq_lens]
    rows = []
    methods = [CUTILE] + args.sdpa_backends
    with tqdm(total=len(points) * len(methods) * args.rounds, unit="run") as progress:
        for dtype, causal, n in points:
            shape = measure.Shape(args.batch, measure.heads_for(args.head_dim, args.heads), n, n,
                                  args.head_dim, causal, dtype)
            inputs = [t.requires_grad_() for t in measure.make_inputs(shape, seed=n)]
            grad_out = torch.randn_like(inputs[0])
            forwards = {CUTILE: lambda: attention(*inputs, is_causal=causal)}
            forwards |= {backend: (lambda backend=backend: measure.sdpa(
                *inputs, causal=causal, backend=backend)) for backend in args.sdpa_backends}
            progress.set_description(f"{dtype} N={n} {'causal' if causal else 'full'}")
            timings = measure.time_in_rounds(
                methods, args.rounds,
                lambda method: time_backward_ms(forwards[method], inputs, grad_out),
                progress.update)
            flops = BACKWARD_FLOPS_PER_FORWARD * shape.flops
            latency = {method: statistics.median(t) for method, t in zip(methods, timings)}
            for method in methods:
                row = {"dtype": dtype, "causal": causal, "seq_len": n,
                       "method": CUTILE if method == CUTILE else f"PyTorch SDPA ({method})",
                       "latency_ms": latency[method],
                       "tflops": measure.tflops(flops, latency[method])}
                if method == CUTILE:
                    row |= {f"vs_{backend}": latency[backend] / latency[CUTILE]
                            for backend in args.sdpa_backends}
                rows.append(row)
            del inputs, grad_out
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The backward benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    context = measure.run_context() | {
        "shape": f"B={args.batch} H={measure.heads_for(args.head_dim, args.heads)} "
                 f"D={args.head_dim}",
        "rounds": args.rounds}
    rows = run(args)
    print(measure.format_context(context))
    print(measure.format_table(rows, COLUMNS))
    if args.json:
        measure.write_json(args.json, context, rows)
    if args.markdown:
        measure.write_markdown(args.markdown, "cuTile FMHA backward", context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
