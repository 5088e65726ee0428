"""SASS counts of "dkdv_dq" at D=128 (compile-only, sm_90, the local tileiras); with an
argument, also writes each SASS to /tmp (dkdv_<c|n>_<argument>.sass). The package as it is
gives sass-counts-before; with one of this folder's diffs applied (`git apply`), the
other sass-counts files."""
import re, collections, sys
from cutile_fmha.steps.compile import compile_backward, resource_usage, sass
for hd in (128,):
  for causal in (True, False):
    cubin = compile_backward("dkdv_dq", "sm_90", dtype="bfloat16", head_dim=hd, causal=causal)
    res = resource_usage(cubin); code = sass(cubin)
    ops = collections.Counter(m.group(1) for m in re.finditer(r"\s([A-Z][A-Za-z0-9_.]+)[ ;]", code))
    pick = {k: sum(v for o, v in ops.items() if o.startswith(k)) for k in ("HGMMA", "WARPGROUP.DEPBAR", "UTMAREDG", "UTMALDG", "BAR.SYNC", "SYNCS.PHASECHK")}
    deps = collections.Counter(re.findall(r"DEPBAR\.LE SB0, (0x[0-9a-f]+)", code))
    regs = re.search(r"REG:(\d+)", res).group(1); stack = re.search(r"STACK:(\d+)", res).group(1); shared = re.search(r"SHARED:(\d+)", res).group(1)
    print(hd, "causal" if causal else "full ", "REG", regs, "STACK", stack, "SHARED", shared, pick, "DEPBAR SB0", dict(deps), flush=True)
    if len(sys.argv) > 1: open(f"/tmp/dkdv_{'c' if causal else 'n'}_{sys.argv[1]}.sass", "w").write(code)
