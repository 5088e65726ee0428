"""Variable-length benchmark: packed batches of sequences of different lengths.

    python assets/fmha_varlen_benchmark.py
    python assets/fmha_varlen_benchmark.py --dtypes float16 bfloat16 --rounds 3

Sequence lengths are drawn uniformly from [--min-len, --max-len] (seeded) until --tokens
tokens are packed, the last one cut to fit. For each dtype, head dim and causal or not,
forward and backward are timed, every method in turn per round, each round starting one
method later, keeping the median of the rounds:
- cuTile varlen: ``attention_varlen`` on the packed batch;
- FA4 varlen: ``flash_attn.cute.flash_attn_varlen_func`` on the same batch, when
  FlashAttention-4 is importable (one line says so when not);
- SDPA padded: PyTorch SDPA on the same sequences padded to the longest (causal: is_causal,
  exact on right padding; not causal: a key-padding mask), its own backend choice;
- cuTile dense, same work: ``attention`` on as many sequences, all of one length, with the
  same FLOPs (the dense kernel's rate at this work: the target is within 10% of it).
TFLOPS count only the real (query, key) pairs: 4·H·Σ l²·D, halved for causal; the
backward counts 2.5x. The forward is timed in a CUDA graph, the backward with do_bench.
"""

import argparse
import math
import statistics
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from cutile_fmha import attention, attention_varlen
from cutile_fmha.assets import measure
from cutile_fmha.assets.fmha_backward_benchmark import BACKWARD_FLOPS_PER_FORWARD
from cutile_fmha.assets.measure import Column

OURS, FA4, SDPA_PADDED, DENSE = "cuTile varlen", "FA4 varlen", "SDPA padded", \
    "cuTile dense, same work"
COLUMNS = [Column("dtype", "dtype"), Column("head_dim", "D"), Column("causal", "causal"),
           Column("pass", "pass"), Column("method", "method"),
           Column("latency_ms", "ms", ".3f"), Column("tflops", "TFLOPS", ".1f"),
           Column("vs_dense", "vs dense", ".2f"), Column("vs_sdpa", "vs SDPA padded", ".2f"),
           Column("vs_fa4", "vs FA4", ".2f")]


def sequence_lengths(tokens: int, low: int, high: int, seed: int) -> list[int]:
    """Lengths uniform in [low, high] until `tokens` in all, the last one cut to fit."""
    generator = torch.Generator().manual_seed(seed)
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(int(torch.randint(low, high + 1, (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - tokens
    return [n for n in lengths if n > 0]


@dataclass
class Batch:
    """One packed batch and everything each method runs on."""
    lengths: list[int]
    packed: list[torch.Tensor]  # q, k, v (total, heads, D), requiring grad
    cu_seqlens: torch.Tensor
    padded: list[torch.Tensor]  # q, k, v (sequences, heads, longest, D), right padding
    key_padding: torch.Tensor  # (sequences, 1, 1, longest): True on real keys
    dense: list[torch.Tensor]  # q, k, v (sequences, heads, same-work length, D)

    @property
    def longest(self) -> int:
        return max(self.lengths)


def make_batch(lengths, heads, kv_heads, head_dim, dtype, seed) -> Batch:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    total, count, longest = sum(lengths), len(lengths), max(lengths)

    def randn(*shape):
        return torch.randn(*shape, generator=generator, device="cuda", dtype=dtype)

    packed = [randn(total, h, head_dim) for h in (heads, kv_heads, kv_heads)]
    cu_seqlens = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    padded = [t.new_zeros(count, t.shape[1], longest, head_dim) for t in packed]
    for i, (start, n) in enumerate(zip(cu_seqlens.tolist(), lengths)):
        for pad, t in zip(padded, packed):
            pad[i, :, :n] = t[start:start + n].transpose(0, 1)
    positions = torch.arange(longest, device="cuda")
    key_padding = (positions < torch.tensor(lengths, device="cuda")[:, None])[:, None, None]
    same_work = round(math.sqrt(sum(n * n for n in lengths) / count))
    dense = [randn(count, h, same_work, head_dim) for h in (heads, kv_heads, kv_heads)]
    return Batch(lengths, [t.requires_grad_() for t in packed], cu_seqlens,
                 [t.requires_grad_() for t in padded], key_padding,
                 [t.requires_grad_() for t in dense])


def forwards(batch: Batch, causal: bool, fa4) -> dict:
    """Each method's forward, as a function of no arguments."""
    q, k, v = batch.packed
    gqa = q.shape[1] != k.shape[1]
    methods = {OURS: lambda: attention_varlen(q, k, v, batch.cu_seqlens, batch.cu_seqlens,
                                              batch.longest, batch.longest, is_causal=causal)}
    if fa4 is not None:
        methods[FA4] = lambda: fa4.flash_attn_varlen_func(
            q, k, v, cu_seqlens_q=batch.cu_seqlens, cu_seqlens_k=batch.cu_seqlens,
            max_seqlen_q=batch.longest, max_seqlen_k=batch.longest, causal=causal)[0]
    mask = None if causal else batch.key_padding
    methods[SDPA_PADDED] = lambda: F.scaled_dot_product_attention(
        *batch.padded, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    methods[DENSE] = lambda: attention(*batch.dense, is_causal=causal, enable_gqa=gqa)
    return methods


def time_method(forward, inputs, backward: bool) -> float:
    """Median ms of the forward (a CUDA graph) or of the backward of one forward."""
    if not backward:
        with torch.no_grad():
            return measure.time_ms(forward)
    from triton.testing import do_bench

    out = forward()
    grad_out = torch.randn_like(out)
    return do_bench(lambda: out.backward(grad_out, retain_graph=True), warmup=50, rep=300,
                    grad_to_none=list(inputs), return_mode="median")


def run(args, fa4) -> list[dict]:
    lengths = sequence_lengths(args.tokens, args.min_len, args.max_len, args.seed)
    points = [(dtype, d, causal, backward) for dtype in args.dtypes for d in args.head_dims
              for causal in (True, False) for backward in (False, True)]
    methods = [OURS] + ([FA4] if fa4 else []) + [SDPA_PADDED, DENSE]
    rows = []
    with tqdm(total=len(points) * len(methods) * args.rounds, unit="run") as progress:
        for dtype, head_dim, causal, backward in points:
            heads = measure.heads_for(head_dim, args.heads)
            batch = make_batch(lengths, heads, args.kv_heads or heads, head_dim,
                               measure.DTYPES[dtype], args.seed)
            fns = forwards(batch, causal, fa4)
            inputs = {OURS: batch.packed, FA4: batch.packed, SDPA_PADDED: batch.padded,
                      DENSE: batch.dense}
            progress.set_description(f"{dtype} D={head_dim} {'causal' if causal else 'full'} "
                                     f"{'backward' if backward else 'forward'}")
            timings = measure.time_in_rounds(
                methods, args.rounds,
                lambda method: time_method(fns[method], inputs[method], backward),
                progress.update)
            latency = {m: statistics.median(t) for m, t in zip(methods, timings)}
            per_pass = BACKWARD_FLOPS_PER_FORWARD if backward else 1.0
            real = per_pass * sum(measure.attention_flops(1, heads, n, n, head_dim, causal)
                                  for n in lengths)
            dense_len = batch.dense[0].shape[2]
            dense = per_pass * measure.attention_flops(len(lengths), heads, dense_len, dense_len,
                                                      head_dim, causal)
            tflops = {m: measure.tflops(dense if m == DENSE else real, latency[m])
                      for m in methods}
            for method in methods:
                row = {"dtype": dtype, "head_dim": head_dim, "causal": causal,
                       "pass": "backward" if backward else "forward", "method": method,
                       "latency_ms": latency[method], "tflops": tflops[method]}
                if method == OURS:
                    row |= {"vs_dense": tflops[OURS] / tflops[DENSE],
                            "vs_sdpa": tflops[OURS] / tflops[SDPA_PADDED],
                            "vs_fa4": tflops[OURS] / tflops[FA4] if fa4 else None}
                rows.append(row)
            del batch, fns, inputs
    return rows


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=measure.positive_int, default=65536)
    parser.add_argument("--min-len", type=measure.positive_int, default=256)
    parser.add_argument("--max-len", type=measure.positive_int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[64, 128],
                        choices=(64, 128, 256))
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16"],
                        choices=sorted(measure.DTYPES))
    parser.add_argument("--heads", type=measure.positive_int, default=None,
                        help="query heads (default: 32, or 16 at D=256)")
    parser.add_argument("--kv-heads", type=measure.positive_int, default=None,
                        help="K/V heads, dividing the query heads (default: as many)")
    measure.add_fa4_argument(parser)
    parser.add_argument("--rounds", type=measure.positive_int, default=1)
    measure.add_result_arguments(parser)
    args = parser.parse_args(argv)
    if args.min_len > args.max_len:
        parser.error(f"--min-len must be at most --max-len, got {args.min_len} and "
                     f"{args.max_len}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The variable-length benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    fa4 = measure.fa4_unless(args)
    lengths = sequence_lengths(args.tokens, args.min_len, args.max_len, args.seed)
    context = measure.run_context() | {
        "sequences": f"{len(lengths)} of lengths uniform in [{args.min_len}, {args.max_len}], "
                     f"{args.tokens} tokens (seed {args.seed}): {lengths}",
        "heads": measure.describe_heads(args.heads, args.kv_heads), "rounds": args.rounds}
    rows = run(args, fa4)
    measure.report(args, "cuTile FMHA variable-length batches", context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
