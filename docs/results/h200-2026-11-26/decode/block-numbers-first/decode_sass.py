"""Instruction counts of the decode kernel's sm_90 SASS, dense (None) and paged (block sizes
16, 64, 256), bf16, D=128, 16 splits (compile-only: needs cuobjdump and nvdisasm on PATH).
Run once with kernels/decode.py as committed and once with block-numbers-first.diff applied."""
import re, collections
from cutile_fmha.steps.compile import compile_decode, sass, resource_usage
def stats(block, splits=16):
    cubin, _ = compile_decode("sm_90", dtype="bfloat16", head_dim=128, block_size=block, splits=splits)
    text = sass(cubin)
    ops = collections.Counter(m.group(1).split('.')[0] for m in re.finditer(r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", text))
    keys = ["UTMALDG", "LDGSTS", "LDG", "LDS", "LDSM", "STS", "HGMMA", "HMMA", "WARPGROUP", "SHFL", "BAR", "SYNCS", "MUFU", "PRMT", "F2FP", "MOV"]
    return resource_usage(cubin), {k: ops.get(k, 0) for k in keys}, sum(ops.values()), text
for block in (None, 16, 64, 256):
    ru, st, total, text = stats(block)
    print(block, ru); print("  ", st, "total", total)
