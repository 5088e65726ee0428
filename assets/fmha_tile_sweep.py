"""Measure a platform entry: time the final step over tile shapes and occupancies.

    python assets/fmha_tile_sweep.py                  # head dims 64/128/256, causal and not
    python assets/fmha_tile_sweep.py --head-dim 128 --seq-len 8192

For each head dim it prints TFLOPS per (TILE_M, TILE_N, occupancy), causal and not, and
the shape with the best mean over both, which is what a table entry in
platforms/table.py should say for this GPU (with the device and the date).
"""

import argparse
import statistics
import sys

from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column
from cutile_fmha.platforms import HEAD_DIMS, PlatformEntry, TileShape
from cutile_fmha.steps import FINAL_STEP, plan_launch

CANDIDATE_TILES = [(64, 64), (128, 64), (64, 128), (128, 128), (128, 32), (256, 64)]
OCCUPANCIES = [1, 2]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-dim", type=int, nargs="+", default=list(HEAD_DIMS),
                        choices=HEAD_DIMS)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=None,
                        help="default: 32, or 16 for D=256 (the same work per head dim)")
    parser.add_argument("--dtype", default="float16", choices=sorted(measure.DTYPES))
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--markdown", metavar="PATH", help="write the results as Markdown")
    return parser.parse_args(argv)


def sweep(args) -> list[dict]:
    rows = []
    for head_dim in args.head_dim:
        heads = args.heads or (16 if head_dim == 256 else 32)
        for tile_m, tile_n in CANDIDATE_TILES:
            for occupancy in OCCUPANCIES:
                entry = PlatformEntry(f"sweep {tile_m}x{tile_n} occ{occupancy}", "this GPU",
                                      {head_dim: TileShape(tile_m, tile_n)}, occupancy,
                                      "unmeasured", "tile sweep candidate")
                row = {"head_dim": head_dim, "tiles": f"{tile_m}x{tile_n}",
                       "occupancy": occupancy}
                for causal in (True, False):
                    shape = measure.Shape(args.batch, heads, args.seq_len, args.seq_len,
                                          head_dim, causal, args.dtype)
                    q, k, v = measure.make_inputs(shape)
                    plan = plan_launch(q, k, v, causal=causal, step=FINAL_STEP, platform=entry)
                    try:
                        latency = measure.time_ms(plan.launch, args.iterations)
                    except Exception as error:  # a shape the compiler refuses is a result
                        print(f"D={head_dim} {row['tiles']} occ{occupancy}: "
                              f"{type(error).__name__}", file=sys.stderr)
                        latency = None
                    key = "causal_tflops" if causal else "full_tflops"
                    row[key] = measure.tflops(shape.flops, latency) if latency else None
                both = [row["causal_tflops"], row["full_tflops"]]
                row["mean_tflops"] = statistics.mean(both) if None not in both else None
                print(f"D={head_dim} {row['tiles']} occ{occupancy}: causal "
                      f"{row['causal_tflops'] or 0:.0f}, full {row['full_tflops'] or 0:.0f} TFLOPS",
                      flush=True)
                rows.append(row)
    return rows


COLUMNS = [Column("head_dim", "D"), Column("tiles", "TILE_MxTILE_N"),
           Column("occupancy", "occupancy"), Column("causal_tflops", "causal TFLOPS", ".0f"),
           Column("full_tflops", "non-causal TFLOPS", ".0f"),
           Column("mean_tflops", "mean", ".0f"), Column("best", "best")]


def main(argv=None) -> int:
    args = parse_args(argv)
    if (problem := measure.gpu_problem("The tile sweep needs")):
        print(problem, file=sys.stderr)
        return 1
    rows = sweep(args)
    for head_dim in args.head_dim:
        timed = [r for r in rows if r["head_dim"] == head_dim and r["mean_tflops"]]
        if timed:
            max(timed, key=lambda r: r["mean_tflops"])["best"] = "<-"
    context = measure.run_context()
    context["shape"] = f"B={args.batch} N={args.seq_len} {args.dtype}, step 6"
    print(measure.format_context(context))
    print(measure.format_table(rows, COLUMNS))
    if args.markdown:
        measure.write_markdown(args.markdown, "cuTile FMHA tile sweep", context, rows, COLUMNS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
