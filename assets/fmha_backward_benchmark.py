"""Backward benchmark: the cuTile backward against SDPA's backends' backward passes.

    python assets/fmha_backward_benchmark.py
    python assets/fmha_backward_benchmark.py --dtypes float16 bfloat16 --rounds 3

For each dtype, causal or not and N it runs one forward per method (FlashAttention-4's too
where flash_attn.cute is importable, unless --no-fa4) with inputs that require grad, then
times ``out.backward(grad_out, retain_graph=True)`` alone (triton's
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
           Column("vs_cudnn", "vs SDPA cuDNN", ".2f"), Column("vs_fa4", "vs FA4", ".2f")]


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
    measure.add_fa4_argument(parser)
    measure.add_result_arguments(parser)
    return parser.parse_args(argv)


def time_backward_ms(forward, inputs, grad_out) -> float:
    """Median milliseconds of the backward of one `forward()` call."""
    from triton.testing import do_bench

    out = forward()
    return do_bench(lambda: out.backward(grad_out, retain_graph=True), warmup=50, rep=300,
                    grad_to_none=list(inputs), return_mode="median")


def _fa4_case(fa4, inputs, grad_out, causal: bool) -> dict:
    """{FA4_NAME: (forward, its leaves, its output's gradient)} in FA4's layout, or {} where
    its forward or backward raises (saying so in one line)."""
    leaves = measure.fa4_inputs(*inputs)
    forward = measure.fa4_forward(fa4, *leaves, causal=causal)
    grad = grad_out.transpose(1, 2).contiguous()
    try:
        forward().backward(grad)
        torch.cuda.synchronize()
    except Exception as error:  # a head dim it has no backward for: a result, not a crash
        print(f"{measure.FA4_NAME} left out at {tuple(inputs[0].shape)}: "
              f"{measure.one_line(error)}")
        return {}
    return {measure.FA4_NAME: (forward, leaves, grad)}


def run(args, fa4=None) -> list[dict]:
    """The table's rows; `fa4`: flash_attn.cute, timed with the others, or None."""
    points = [(dtype, causal, n) for dtype in args.dtypes for causal in (True, False)
              for n in args.seq_lens]
    rows = []
    methods = [CUTILE] + args.sdpa_backends + ([measure.FA4_NAME] if fa4 else [])
    with tqdm(total=len(points) * len(methods) * args.rounds, unit="run") as progress:
        for dtype, causal, n in points:
            shape = measure.Shape(args.batch, measure.heads_for(args.head_dim, args.heads), n, n,
                                  args.head_dim, causal, dtype)
            inputs = [t.requires_grad_() for t in measure.make_inputs(shape, seed=n)]
            grad_out = torch.randn_like(inputs[0])
            # method -> (forward, the leaves it differentiates, the gradient of its output)
            cases = {CUTILE: (lambda: attention(*inputs, is_causal=causal), inputs, grad_out)}
            cases |= {backend: (lambda backend=backend: measure.sdpa(
                *inputs, causal=causal, backend=backend), inputs, grad_out)
                for backend in args.sdpa_backends}
            if fa4:  # its own layout, (B, N, H, D): copied once, outside the timings
                cases |= _fa4_case(fa4, inputs, grad_out, causal)
            progress.set_description(f"{dtype} N={n} {'causal' if causal else 'full'}")
            progress.update(sum(method not in cases for method in methods) * args.rounds)
            timed = [method for method in methods if method in cases]
            timings = measure.time_in_rounds(
                timed, args.rounds, lambda method: time_backward_ms(*cases[method]),
                progress.update)
            flops = BACKWARD_FLOPS_PER_FORWARD * shape.flops
            latency = {method: statistics.median(t) for method, t in zip(timed, timings)}
            for method in timed:
                row = {"dtype": dtype, "causal": causal, "seq_len": n,
                       "method": method if method in (CUTILE, measure.FA4_NAME)
                       else f"PyTorch SDPA ({method})",
                       "latency_ms": latency[method],
                       "tflops": measure.tflops(flops, latency[method])}
                if method == CUTILE:
                    row |= {f"vs_{backend}": latency[backend] / latency[CUTILE]
                            for backend in args.sdpa_backends}
                    if measure.FA4_NAME in latency:
                        row["vs_fa4"] = latency[measure.FA4_NAME] / latency[CUTILE]
                rows.append(row)
            del inputs, grad_out, cases
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
    fa4 = measure.fa4_unless(args, context)
    rows = run(args, fa4)
    measure.report(args, "cuTile FMHA backward", context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
