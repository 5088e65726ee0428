"""Variants benchmark: sliding window, logit softcap and attention sinks against the plain
kernel on the same inputs (and FlashAttention-4's windowed forward where it is importable).

    python assets/fmha_variants_benchmark.py
    python assets/fmha_variants_benchmark.py --window-seq-len 65536 --window 8192 --rounds 5

Two tables. The window: B=1, H=32 (K/V heads 8), D=128, bf16, causal, N=--window-seq-len,
a window of --window keys against the full causal attention, ours and SDPA cuDNN's (which
has no window: the full causal work), and FA4 with window_size=(window, 0). TFLOPS count
the pairs each row sees (4·D per pair). The cost of the others: at B=4, H=32, N=8192,
D=128, bf16, causal and not, plain, softcap 30, sinks, and both, each against plain.
Every method is timed in rotating rounds (the median kept).
"""

import argparse
import statistics
import sys

import torch
from tqdm import tqdm

from cutile_fmha import attention
from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column

COLUMNS = [Column("case", "case"), Column("causal", "causal"), Column("method", "method"),
           Column("latency_ms", "forward (ms)", ".3f"), Column("tflops", "TFLOPS", ".1f"),
           Column("vs_plain", "time / plain", ".3f"), Column("vs_fa4", "time / FA4", ".3f")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-seq-len", type=measure.positive_int, default=32768)
    parser.add_argument("--window", type=measure.positive_int, default=4096)
    parser.add_argument("--seq-len", type=measure.positive_int, default=8192,
                        help="N of the softcap and sinks table")
    parser.add_argument("--rounds", type=measure.positive_int, default=3)
    measure.add_fa4_argument(parser)
    measure.add_result_arguments(parser)
    return parser.parse_args(argv)


def windowed_pairs(n: int, window: int) -> int:
    """Causal query-key pairs with at most `window` keys before each query's diagonal."""
    return sum(min(i, window) + 1 for i in range(n))


def timed_rows(case: str, causal: bool, calls: dict, flops: dict, rounds: int, progress,
               baseline: str) -> list[dict]:
    names = list(calls)
    timings = measure.time_in_rounds(names, rounds, lambda name: measure.time_ms(calls[name]),
                                     progress.update)
    latency = {name: statistics.median(t) for name, t in zip(names, timings)}
    return [{"case": case, "causal": causal, "method": name, "latency_ms": latency[name],
             "tflops": measure.tflops(flops[name], latency[name]),
             "vs_plain": latency[name] / latency[baseline],
             "vs_fa4": latency[name] / latency[measure.FA4_NAME]
             if measure.FA4_NAME in latency and name != measure.FA4_NAME else None}
            for name in names]


def window_rows(args, fa4, progress) -> list[dict]:
    n, window = args.window_seq_len, args.window
    shape = measure.Shape(1, 32, n, n, 128, True, "bfloat16", kv_heads=8)
    q, k, v = measure.make_inputs(shape)
    full = "ours, full causal"
    calls = {f"ours, window {window}": lambda: attention(q, k, v, is_causal=True,
                                                           enable_gqa=True,
                                                           window_size=(window, 0)),
             full: lambda: attention(q, k, v, is_causal=True, enable_gqa=True),
             "PyTorch SDPA (cudnn), full causal": lambda: measure.sdpa(q, k, v, causal=True,
                                                                       backend="cudnn")}
    per_pair = 4 * 128 * 32
    flops = {name: per_pair * (windowed_pairs(n, window) if "window" in name else n * (n + 1) / 2)
             for name in calls}
    if fa4:
        fq, fk, fv = measure.fa4_inputs(q, k, v)
        calls[measure.FA4_NAME] = lambda: fa4.flash_attn_func(fq, fk, fv, causal=True,
                                                              window_size=(window, 0))[0]
        flops[measure.FA4_NAME] = per_pair * windowed_pairs(n, window)
    progress.update((4 - len(calls)) * args.rounds)
    return timed_rows(f"N={n} window {window}", True, calls, flops, args.rounds, progress,
                      baseline=full)


def cost_rows(args, causal: bool, progress) -> list[dict]:
    shape = measure.Shape(4, 32, args.seq_len, args.seq_len, 128, causal, "bfloat16")
    q, k, v = measure.make_inputs(shape)
    sinks = torch.randn(32, device="cuda")
    options = {"plain": {}, "softcap 30": {"softcap": 30.0}, "sinks": {"sinks": sinks},
               "softcap 30 + sinks": {"softcap": 30.0, "sinks": sinks}}
    calls = {name: (lambda o=o: attention(q, k, v, is_causal=causal, **o))
             for name, o in options.items()}
    return timed_rows(f"N={args.seq_len}", causal, calls, dict.fromkeys(calls, shape.flops),
                      args.rounds, progress, baseline="plain")


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The variants benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    context = measure.run_context() | {"rounds": args.rounds}
    fa4 = measure.fa4_unless(args, context)
    with torch.no_grad(), tqdm(total=4 * args.rounds + 8 * args.rounds, unit="run") as progress:
        rows = window_rows(args, fa4, progress)
        for causal in (True, False):
            rows += cost_rows(args, causal, progress)
    measure.report(args, "cuTile FMHA variants", context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
