"""SASS counts of "dkdv_dq" with and without CAST_DQ (apply cast-dq-per-turn.diff first;
compile-only, sm_90, the local tileiras). Output: cast-dq-sass-counts-tileiras-13.5.txt."""
import re, sys, collections
from cutile_fmha.steps.compile import compile_backward, resource_usage, sass
for hd in (128, 64):
  for causal in (True, False):
    for cast in (False, True):
        cubin = compile_backward("dkdv_dq", "sm_90", dtype="bfloat16", head_dim=hd, causal=causal, cast_dq=cast)
        res = resource_usage(cubin); code = sass(cubin)
        ops = collections.Counter(m.group(1) for m in re.finditer(r"\s([A-Z][A-Za-z0-9_.]+)[ ;]", code))
        pick = {k: sum(v for o, v in ops.items() if o.startswith(k)) for k in ("HGMMA", "WARPGROUP.DEPBAR", "MEMBAR.ALL.GPU", "ATOMG", "UTMAREDG", "LDG", "STG", "UTMASTG", "BAR.SYNC", "CCTL")}
        regs = re.search(r"REG:(\d+)", res).group(1); stack = re.search(r"STACK:(\d+)", res).group(1); shared = re.search(r"SHARED:(\d+)", res).group(1)
        print(hd, "causal" if causal else "full ", "cast" if cast else "plain", "REG", regs, "STACK", stack, "SHARED", shared, pick, flush=True)
