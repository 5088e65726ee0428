"""Variants benchmark: sliding window, logit softcap and attention sinks against the plain
kernel on the same inputs (and FlashAttention-4's windowed forward where it is importable).

    python assets/fmha_variants_benchmark.py
    python assets/fmha_variants_benchmark.py --window-seq-len 65536 --window 8192 --rounds 5
    python assets/fmha_variants_benchmark.py --backward    # the same tables, backward

Two tables. The window: B=1, H=32 (K/V heads 8), D=128, bf16, causal, N=--window-seq-len,
a window of --window keys against the full causal attention, ours and SDPA cuDNN's (which
has no window: the full causal work), and FA4 with window_size=(window, 0). TFLOPS count
the pairs each row sees (4·D per pair). The cost of the others: at B=4, H=32, N=8192,
D=128, bf16, causal and not, plain, softcap 30, sinks, and both, each against plain. The
head dims step 9's code pads (D=96, and D_qk=192 with D_v=128, at B=4, H=32, N=--seq-len,
bf16, causal and not) against SDPA's cuDNN backend and its flash backend where they run
them (TFLOPS count D_qk + D_v, not the padding). The forward adds decoding: one token for
each of 16 sequences from a cache of --window-seq-len keys, plain, windowed, and with
softcap and sinks, in the decode kernel.
With --backward each row times the backward of one forward call (dQ, dK, dV, and with
sinks dsinks; 2.5x the forward's FLOPs), FA4's where it runs the case. Every method is
timed in rotating rounds (the median kept).
"""

import argparse
import functools
import statistics
import sys

import torch
from tqdm import tqdm

from cutile_fmha import attention, attention_with_kvcache
from cutile_fmha.assets import measure
from cutile_fmha.assets.fmha_backward_benchmark import BACKWARD_FLOPS_PER_FORWARD, time_backward_ms
from cutile_fmha.assets.measure import Column

COLUMNS = [Column("case", "case"), Column("causal", "causal"), Column("method", "method"),
           Column("latency_ms", "time (ms)", ".3f"), Column("tflops", "TFLOPS", ".1f"),
           Column("vs_baseline", "time / baseline", ".3f"),
           Column("vs_fa4", "time / FA4", ".3f")]
HEAD_DIMS = [(96, 96), (192, 128)]  # (D_qk, D_v)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window-seq-len", type=measure.positive_int, default=32768)
    parser.add_argument("--window", type=measure.positive_int, default=4096)
    parser.add_argument("--seq-len", type=measure.positive_int, default=8192,
                        help="N of the softcap and sinks table")
    parser.add_argument("--rounds", type=measure.positive_int, default=3)
    parser.add_argument("--backward", action="store_true",
                        help="time the backward of each call instead of the forward")
    measure.add_fa4_argument(parser)
    measure.add_result_arguments(parser)
    return parser.parse_args(argv)


def windowed_pairs(n: int, window: int) -> int:
    """Causal query-key pairs with at most `window` keys before each query's diagonal."""
    return sum(min(i, window) + 1 for i in range(n))


def timed_rows(case: str, causal: bool, calls: dict, flops: dict, args, progress,
               baseline: str) -> list[dict]:
    """Each of `calls` (name -> (forward, the leaves it differentiates)) timed in rotating
    rounds, its forward or (--backward) the backward of one call, as rows against
    `baseline` and FA4."""
    names = list(calls)
    if args.backward:
        grad_out = torch.randn_like(calls[baseline][0]())

        def time_one(name):
            forward, leaves = calls[name]
            grad = grad_out if name != measure.FA4_NAME else grad_out.transpose(1, 2).contiguous()
            return time_backward_ms(forward, leaves, grad)
    else:
        def time_one(name):
            return measure.time_ms(calls[name][0])
    timings = measure.time_in_rounds(names, args.rounds, time_one, progress.update)
    latency = {name: statistics.median(t) for name, t in zip(names, timings)}
    per_pass = BACKWARD_FLOPS_PER_FORWARD if args.backward else 1.0
    return [{"case": case, "causal": causal, "method": name, "latency_ms": latency[name],
             "tflops": measure.tflops(per_pass * flops[name], latency[name]),
             "vs_baseline": latency[name] / latency[baseline],
             "vs_fa4": latency[name] / latency[measure.FA4_NAME]
             if measure.FA4_NAME in latency and name != measure.FA4_NAME else None}
            for name in names]


def window_rows(args, fa4, progress) -> list[dict]:
    n, window = args.window_seq_len, args.window
    shape = measure.Shape(1, 32, n, n, 128, True, "bfloat16", kv_heads=8)
    q, k, v = leaves = [t.requires_grad_(args.backward) for t in measure.make_inputs(shape)]
    full = "ours, full causal"
    calls = {f"ours, window {window}": (lambda: attention(q, k, v, is_causal=True,
                                                            enable_gqa=True,
                                                            window_size=(window, 0)), leaves),
             full: (lambda: attention(q, k, v, is_causal=True, enable_gqa=True), leaves),
             "PyTorch SDPA (cudnn), full causal": (lambda: measure.sdpa(
                 q, k, v, causal=True, backend="cudnn"), leaves)}
    per_pair = 4 * 128 * 32
    flops = {name: per_pair * (windowed_pairs(n, window) if "window" in name else n * (n + 1) / 2)
             for name in calls}
    if fa4:
        fa4_leaves = measure.fa4_inputs(q, k, v)
        calls[measure.FA4_NAME] = (lambda: fa4.flash_attn_func(*fa4_leaves, causal=True,
                                                               window_size=(window, 0))[0],
                                   fa4_leaves)
        flops[measure.FA4_NAME] = per_pair * windowed_pairs(n, window)
        if args.backward:
            try:
                calls[measure.FA4_NAME][0]().sum().backward()
                torch.cuda.synchronize()
            except Exception as error:  # no windowed backward there: a result, not a crash
                print(f"{measure.FA4_NAME} left out: {measure.one_line(error)}")
                del calls[measure.FA4_NAME], flops[measure.FA4_NAME]
    progress.update((4 - len(calls)) * args.rounds)
    return timed_rows(f"N={n} window {window}", True, calls, flops, args, progress,
                      baseline=full)


def cost_rows(args, causal: bool, progress) -> list[dict]:
    shape = measure.Shape(4, 32, args.seq_len, args.seq_len, 128, causal, "bfloat16")
    q, k, v = leaves = [t.requires_grad_(args.backward) for t in measure.make_inputs(shape)]
    sinks = torch.randn(32, device="cuda", requires_grad=args.backward)
    options = {"plain": {}, "softcap 30": {"softcap": 30.0}, "sinks": {"sinks": sinks},
               "softcap 30 + sinks": {"softcap": 30.0, "sinks": sinks}}
    calls = {name: (lambda o=o: attention(q, k, v, is_causal=causal, **o),
                    leaves + ([sinks] if "sinks" in o else []))
             for name, o in options.items()}
    return timed_rows(f"N={args.seq_len}", causal, calls, dict.fromkeys(calls, shape.flops),
                      args, progress, baseline="plain")


def head_dim_rows(args, causal: bool, progress) -> list[dict]:
    rows = []
    for q_dim, v_dim in HEAD_DIMS:
        q, k = measure.make_inputs(measure.Shape(4, 32, args.seq_len, args.seq_len, q_dim, causal,
                                                 "bfloat16"))[:2]
        v = torch.randn(*k.shape[:-1], v_dim, device="cuda", dtype=k.dtype)
        leaves = [t.requires_grad_(args.backward) for t in (q, k, v)]
        calls = {"ours": (lambda: attention(q, k, v, is_causal=causal), leaves)}
        for backend in ("cudnn", "flash"):
            call = functools.partial(measure.sdpa, q, k, v, causal=causal, backend=backend)
            try:  # the pass timed, once: a backend that does not run these raises
                out = call()
                if args.backward:
                    out.sum().backward()
                torch.cuda.synchronize()
                calls[f"PyTorch SDPA ({backend})"] = (call, leaves)
            except RuntimeError as error:
                print(f"PyTorch SDPA ({backend}) left out at D={q_dim}/{v_dim}: "
                      f"{measure.one_line(error)}")
        flops = 2.0 * 4 * 32 * args.seq_len ** 2 * (q_dim + v_dim) / (2 if causal else 1)
        baseline = "PyTorch SDPA (cudnn)" if "PyTorch SDPA (cudnn)" in calls else "ours"
        progress.update((3 - len(calls)) * args.rounds)
        rows += timed_rows(f"D={q_dim}/{v_dim} N={args.seq_len}", causal, calls,
                           dict.fromkeys(calls, flops), args, progress, baseline=baseline)
    return rows


def decode_rows(args, progress) -> list[dict]:
    """Decoding one token per sequence (B=16, H=32/8, D=128, bf16) from a cache of
    --window-seq-len keys: plain, with a window of --window keys, with softcap 30 and
    sinks, against plain (forward only). FLOPs count the pairs each row sees."""
    batch, capacity = 16, args.window_seq_len
    q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
    cache = [torch.randn(batch, 8, capacity, 128, device="cuda", dtype=torch.bfloat16)
             for _ in range(2)]
    sinks = torch.randn(32, device="cuda")
    options = {"plain": {}, f"window {args.window}": {"window_size": (args.window, 0)},
               "softcap 30 + sinks": {"softcap": 30.0, "sinks": sinks}}
    calls = {name: (lambda o=o: attention_with_kvcache(q, *cache, **o), [])
             for name, o in options.items()}
    seen = {name: min(capacity, args.window + 1) if "window" in name else capacity
            for name in calls}
    return timed_rows(f"decode B={batch} cache {capacity}", True, calls,
                      {name: 4.0 * batch * 32 * seen[name] * 128 for name in calls}, args,
                      progress, baseline="plain")


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The variants benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    context = measure.run_context() | {"rounds": args.rounds}
    fa4 = measure.fa4_unless(args, context)
    with torch.set_grad_enabled(args.backward), \
            tqdm(total=(4 + 8 + 6 * len(HEAD_DIMS) + 3 * (not args.backward)) * args.rounds,
                 unit="run") as progress:
        rows = window_rows(args, fa4, progress)
        for causal in (True, False):
            rows += cost_rows(args, causal, progress)
        for causal in (True, False):
            rows += head_dim_rows(args, causal, progress)
        if not args.backward:
            rows += decode_rows(args, progress)
    measure.report(args, f"cuTile FMHA variants, {'backward' if args.backward else 'forward'}",
                   context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
