"""Compile-only, sm_90: the decode kernel's paged launches with the columns on the M side
(block sizes 64 and 256) beside the dense one: registers, stack, producer warp, HGMMA,
UTMALDG, SHFL, STS, and the stack of shared memory."""
import re, sys
from cutile_fmha.steps.compile import compile_decode, sass, resource_usage
from cutile_fmha.steps.variants import Variants
cases = [dict(head_dim=d, q_len=q, splits=s, block_size=b, causal=True)
         for d in (128, 64, 256) for q in (16, 32) for s in (1, 4) for b in (None, 64, 256)]
cases += [dict(head_dim=128, q_len=16, splits=4, block_size=64, causal=True,
               variants=Variants(window=(100, 0), softcap=30.0, sinks=True))]
for kw in cases:
    cubin = compile_decode("sm_90", dtype="bfloat16", **kw)[0]
    code, res = sass(cubin), resource_usage(cubin)
    regs = re.search(r"REG:(\d+)", res).group(1); stack = re.search(r"STACK:(\d+)", res).group(1)
    shared = re.search(r"SHARED:(\d+)", res).group(1)
    counts = {k: code.count(k) for k in ("USETMAXREG", "HGMMA", "UTMALDG", "SHFL", "STS", "LDG", "DEPBAR")}
    print({k: v for k, v in kw.items() if k != "causal"}, f"REG {regs} STACK {stack} SHARED {shared}", counts, flush=True)
