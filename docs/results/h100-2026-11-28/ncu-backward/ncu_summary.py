"""Tables from the Nsight Compute report of ncu_profile.py (ncu-raw.csv.gz: `ncu --import
rep.ncu-rep --page raw --csv`; ncu-source.csv.gz: `--page source --print-source sass
--csv`): per kernel, the pipes' use and the warps' stall reasons; then, for our kernels,
where the stall samples fall (SASS opcode and the costliest instructions)."""
import collections, csv, gzip, io, os

HERE = os.path.dirname(os.path.abspath(__file__))
SHORT = ("convert_dq", "dot_do_o", "row_dot", "dkdv", "dq_", "fprop", "bprop", "fwd_sm90",
         "bwd_preprocess", "bwd_sm90", "bwd_postprocess", "fmha")
METRICS = {"ms": "gpu__time_duration.sum", "grid": "launch__grid_size",
           "tensor %": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
           "MUFU %": "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
           "issue %": "sm__issue_active.avg.pct_of_peak_sustained_elapsed",
           "shared %": "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum.pct_of_peak_sustained_elapsed",
           "warps": "sm__warps_active.avg.per_cycle_active"}
STALLS = ("barrier", "long_scoreboard", "wait", "gmma", "mio_throttle", "short_scoreboard",
          "dispatch_stall")


def short(name):
    return next((k.rstrip("_") for k in SHORT if k in name), name[:12])


def kernels_table():
    rows = list(csv.reader(io.StringIO(gzip.open(os.path.join(HERE, "ncu-raw.csv.gz"), "rt").read())))
    hdr, data = rows[0], rows[2:]
    data = [d for d in data if "elementwise" not in d[hdr.index("Kernel Name")]]
    cols = list(METRICS) + [f"stall {s}" for s in STALLS]
    keys = list(METRICS.values()) + [f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"
                                     for s in STALLS]
    print(f"{'kernel':16s}" + "".join(f"{c[:13]:>14s}" for c in cols))
    for d in data:
        values = [float(d[hdr.index(k)].replace(",", "")) for k in keys]
        print(f"{short(d[hdr.index('Kernel Name')]):16s}" + "".join(f"{v:14.3g}" for v in values))


def stall_locations(kernel, top=12):
    text = gzip.open(os.path.join(HERE, "ncu-source.csv.gz"), "rt").read().splitlines()
    blocks, current = [], None
    for line in text:
        if line.startswith('"Kernel Name"'):
            current = [line]
            blocks.append(current)
        else:
            current.append(line)
    block = next(b for b in blocks if kernel in b[0])
    rows = list(csv.reader(io.StringIO("\n".join(block[1:]))))
    hdr, data = rows[0], rows[1:]
    samples, source = hdr.index("Warp Stall Sampling (All Samples)"), hdr.index("Source")
    reasons = [i for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(int(r[samples]) for r in data)
    by_op = collections.Counter()
    for r in data:
        words = [w for w in r[source].split() if not w.startswith("@")]
        by_op[words[0].split(".")[0] if words else "?"] += int(r[samples])
    print(f"\n{kernel}: {len(data)} instructions, {total} stall samples; by opcode:",
          ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(8)))
    for i in sorted(sorted(range(len(data)), key=lambda i: -int(data[i][samples]))[:top]):
        r = data[i]
        why = max(reasons, key=lambda j: int(r[j] or 0))
        print(f"  {i:5d} {100 * int(r[samples]) / total:5.1f}%  {r[source].strip()[:60]:60s} {hdr[why][6:]}")


if __name__ == "__main__":
    kernels_table()
    for kernel in ("fmha_", "dkdv_", "dq_Kt1"):
        stall_locations(kernel)
