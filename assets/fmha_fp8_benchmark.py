"""FP8 benchmark: the float8 forward against our bfloat16 one, SDPA's cuDNN and FA4.

    python assets/fmha_fp8_benchmark.py
    python assets/fmha_fp8_benchmark.py --head-dims 128 --seq-lens 8192 --rounds 3

For each head dim, causal or not and N it makes standard-normal bfloat16 inputs, quantizes
them per head with ``to_fp8`` (V transposed, outside the timings) and times, in rotating
rounds, ``attention_fp8`` on them, our bfloat16 ``attention`` and SDPA's cuDNN backend on
the bfloat16 inputs, and FlashAttention-4 where flash_attn.cute is importable (unless
--no-fa4). TFLOPS count 4·B·H·N²·D, halved for causal. Accuracy: the RMS error of the FP8
and of the bfloat16 output against a float32 reference on the bfloat16 inputs, relative to
the reference's RMS (the FP8 error includes quantizing the inputs). Writes the table as
JSON and Markdown with --json / --markdown.
"""

import argparse
import statistics
import sys

import torch
from tqdm import tqdm

from cutile_fmha import attention, attention_fp8, to_fp8
from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column

FP8, BF16 = "cuTile FP8", "cuTile bf16"
COLUMNS = [Column("head_dim", "D"), Column("causal", "causal"), Column("seq_len", "N"),
           Column("method", "method"), Column("latency_ms", "forward (ms)", ".3f"),
           Column("tflops", "TFLOPS", ".1f"), Column("fp8_speedup", "FP8 speed-up", ".2f"),
           Column("rms_error", "RMS error (relative)", ".2e")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dims", type=int, nargs="+", default=[128, 256],
                        choices=(64, 128, 256))
    parser.add_argument("--seq-lens", type=measure.positive_int, nargs="+",
                        default=[4096, 8192, 16384])
    parser.add_argument("--batch", type=measure.positive_int, default=4)
    parser.add_argument("--heads", type=measure.positive_int, default=None,
                        help="query heads (default: 32, or 16 at D=256)")
    parser.add_argument("--rounds", type=measure.positive_int, default=3)
    measure.add_fa4_argument(parser)
    measure.add_result_arguments(parser)
    return parser.parse_args(argv)


def relative_rms_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out.float() - reference).pow(2).mean().sqrt() / reference.pow(2).mean().sqrt()).item()


def run(args, fa4=None) -> list[dict]:
    points = [(d, causal, n) for d in args.head_dims for causal in (True, False)
              for n in args.seq_lens]
    methods = [FP8, BF16, "cudnn"] + ([measure.FA4_NAME] if fa4 else [])
    rows = []
    with tqdm(total=len(points) * len(methods) * args.rounds, unit="run") as progress:
        for head_dim, causal, n in points:
            shape = measure.Shape(args.batch, measure.heads_for(head_dim, args.heads), n, n,
                                  head_dim, causal, "bfloat16")
            q, k, v = measure.make_inputs(shape, seed=n)
            (q8, qd), (k8, kd), (v8_t, vd) = (to_fp8(t, transpose=t is v) for t in (q, k, v))
            calls = {FP8: lambda: attention_fp8(q8, k8, v8_t, q_descale=qd, k_descale=kd,
                                                v_descale=vd, is_causal=causal),
                     BF16: lambda: attention(q, k, v, is_causal=causal),
                     "cudnn": lambda: measure.sdpa(q, k, v, causal=causal, backend="cudnn")}
            if fa4 and (method := measure.fa4_method(fa4, q, k, v, causal=causal)):
                calls[measure.FA4_NAME] = method.run
            progress.set_description(f"D={head_dim} N={n} {'causal' if causal else 'full'}")
            progress.update(sum(m not in calls for m in methods) * args.rounds)
            timed = [m for m in methods if m in calls]
            timings = measure.time_in_rounds(timed, args.rounds,
                                             lambda m: measure.time_ms(calls[m]),
                                             progress.update)
            latency = {m: statistics.median(t) for m, t in zip(timed, timings)}
            # The reference on one batch row, to bound its memory at N=16384.
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                reference = torch.nn.functional.scaled_dot_product_attention(
                    *(t[:1].float() for t in (q, k, v)), is_causal=causal)
            errors = {FP8: relative_rms_error(calls[FP8]()[:1], reference),
                      BF16: relative_rms_error(calls[BF16]()[:1], reference)}
            for m in timed:
                row = {"head_dim": head_dim, "causal": causal, "seq_len": n,
                       "method": m if m in (FP8, BF16, measure.FA4_NAME)
                       else f"PyTorch SDPA ({m}, bf16)", "latency_ms": latency[m],
                       "tflops": measure.tflops(shape.flops, latency[m]),
                       "rms_error": errors.get(m)}
                if m == FP8:
                    row["fp8_speedup"] = latency[BF16] / latency[FP8]
                rows.append(row)
            del q, k, v, q8, k8, v8_t, calls, reference
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The FP8 benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    context = measure.run_context() | {
        "shape": f"B={args.batch}, {measure.describe_heads(args.heads, None)}, inputs "
                 f"standard normal", "rounds": args.rounds}
    fa4 = measure.fa4_unless(args, context)
    rows = run(args, fa4)
    measure.report(args, "cuTile FMHA FP8 forward", context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
