"""Tables from the Nsight Compute report of ncu_persistent.py (ncu-raw.csv.gz: `ncu
--import rep.ncu-rep --page raw --csv`; ncu-source.csv.gz: `--page source --print-source
sass --csv`): per kernel its time, tensor pipe, L2 and DRAM, and the warps' stall reasons;
then where each kernel's stall samples fall (SASS opcode, and the costliest instructions)."""
import collections
import csv
import gzip
import io
import os

HERE = os.path.dirname(os.path.abspath(__file__))
NAMES = ["step 9, causal", "persistent, causal", "step 9, non-causal", "persistent, non-causal"]
METRICS = {"ms": "gpu__time_duration.sum", "grid": "launch__grid_size",
           "tensor %": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
           "warps": "sm__warps_active.avg.per_cycle_active",
           "L2 hit %": "lts__t_sector_hit_rate.pct", "DRAM GB read": "dram__bytes_read.sum"}
STALLS = ("barrier", "long_scoreboard", "wait", "mio_throttle", "short_scoreboard",
          "dispatch_stall", "gmma")


def csv_rows(name):
    return list(csv.reader(io.StringIO(gzip.open(os.path.join(HERE, name), "rt").read())))


def kernels_table():
    rows = csv_rows("ncu-raw.csv.gz")
    hdr, data = rows[0], rows[2:]
    keys = list(METRICS.values()) + [f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
                                     for s in STALLS]
    print(f"{'kernel':24s}" + "".join(f"{c[:13]:>14s}" for c in list(METRICS) + list(STALLS)))
    for name, d in zip(NAMES, data):
        values = [float(d[hdr.index(k)].replace(",", "")) for k in keys]
        print(f"{name:24s}" + "".join(f"{v:14.3g}" for v in values))


def stall_locations(top=10):
    blocks, current = [], None
    for line in gzip.open(os.path.join(HERE, "ncu-source.csv.gz"), "rt").read().splitlines():
        if line.startswith('"Kernel Name"'):
            current = [line]
            blocks.append(current)
        elif current is not None:
            current.append(line)
    for name, block in zip(NAMES, blocks):
        rows = list(csv.reader(io.StringIO("\n".join(block[1:]))))
        hdr, data = rows[0], rows[1:]
        samples, source = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Source")
        reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
        total = sum(int(r[samples] or 0) for r in data)
        by_op = collections.Counter()
        for r in data:
            words = [w for w in r[source].split() if not w.startswith("@")]
            by_op[words[0].split(".")[0] if words else "?"] += int(r[samples] or 0)
        print(f"\n{name}: {len(data)} instructions, {total} stall samples; by opcode:",
              ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(8)))
        for i in sorted(sorted(range(len(data)), key=lambda i: -int(data[i][samples] or 0))[:top]):
            r = data[i]
            why = max(reasons, key=lambda j: int(r[j] or 0))
            print(f"  {i:5d} {100 * int(r[samples]) / total:5.1f}%  {r[source].strip()[:58]:58s} "
                  f"{hdr[why][6:]}")


if __name__ == "__main__":
    kernels_table()
    stall_locations()
