"""SASS counts of "dkdv_dq" (compile-only, sm_90, the local tileiras, bf16) at the table's
launch of each head dim that runs it, with its dQ added on time and one turn late (DQ_LATE):
registers, stack, shared memory, products, waits and dS^T stores; and where the consumer
warpgroups wait for the float32 dQ tile's staging buffer (the mbarrier that the reduction
warp arrives on after `DEPBAR.LE SB0, 0x0`): the products (HGMMA) issued in the loop body
before that wait, out of all of the body's. Each SASS is written to /tmp."""
import collections
import re

from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, backward_kernel, gradient_launch
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass


def staging_waits(code: str) -> list[str]:
    """For each consumer wait on a staging-free mbarrier: HGMMA since the loop body's top
    (the last backward branch's target) / HGMMA in that body."""
    lines = code.splitlines()
    free = set()
    for i, line in enumerate(lines):
        if "DEPBAR.LE SB0, 0x0" in line:
            for nxt in lines[i + 1:i + 8]:
                m = re.search(r"SYNCS\.ARRIVE\.TRANS64\.A1T0 RZ, \[UR\d+\+(0x[0-9a-f]+)\]", nxt)
                if m:
                    free.add(m.group(1))
                    break
    address = {int(m.group(1), 16): i for i, line in enumerate(lines)
               if (m := re.match(r"\s*/\*([0-9a-f]{4,})\*/", line))}
    loops = []  # (top, bottom) line numbers of backward branches
    for i, line in enumerate(lines):
        m = re.search(r"@P\d BRA 0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) in address and address[int(m.group(1), 16)] < i:
            loops.append((address[int(m.group(1), 16)], i))
    found = []
    for i, line in enumerate(lines):
        m = re.search(r"SYNCS\.PHASECHK\.TRANS64\.TRYWAIT P0, \[UR\d+\+(0x[0-9a-f]+)\]", line)
        if not (m and m.group(1) in free):
            continue
        body = [(top, bottom) for top, bottom in loops if top <= i <= bottom]
        if not body:
            found.append("outside a loop")
            continue
        top, bottom = min(body, key=lambda b: b[1] - b[0])
        before = sum("HGMMA" in x for x in lines[top:i])
        found.append(f"{before}/{sum('HGMMA' in x for x in lines[top:bottom])}")
    return found


def main():
    entry = backward_entry_for("sm_90")
    for hd in (64, 128, 256):
        for causal in (True, False):
            for late in (False, True):
                launch, constants = gradient_launch(entry, "dkdv_dq", hd, hd, query_group=1,
                                                    causal=causal)
                cubin = export_cubin(backward_kernel("dkdv_dq", launch.num_worker_warps),
                                     BACKWARD_FAMILIES["dkdv_dq"], dtype="bfloat16",
                                     constants=constants | {"DQ_LATE": late}, arch="sm_90")
                res, code = resource_usage(cubin), sass(cubin)
                ops = collections.Counter(
                    m.group(1) for m in re.finditer(r"\s([A-Z][A-Za-z0-9_.]+)[ ;]", code))
                pick = {k: sum(v for o, v in ops.items() if o.startswith(k))
                        for k in ("HGMMA", "WARPGROUP.DEPBAR", "UTMAREDG", "STSM")}
                regs, stack, shared = (re.search(rf"{k}:(\d+)", res).group(1)
                                       for k in ("REG", "STACK", "SHARED"))
                name = f"d{hd}_{'causal' if causal else 'full'}_{'late' if late else 'on_time'}"
                print(f"D={hd} {'causal' if causal else 'full  '} dQ "
                      f"{'late   ' if late else 'on time'}: REG {regs} STACK {stack} SHARED "
                      f"{shared} {pick}; staging waits (HGMMA before / in the loop body): "
                      f"{', '.join(staging_waits(code))}", flush=True)
                with open(f"/tmp/dkdv_dq_{name}.sass", "w") as file:
                    file.write(code)


main()
