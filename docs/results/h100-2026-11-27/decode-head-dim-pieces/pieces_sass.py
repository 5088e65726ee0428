import re
from cutile_fmha.steps.compile import compile_decode, sass, resource_usage
for c in [dict(head_dim=80), dict(head_dim=96), dict(head_dim=80, block_size=64), dict(head_dim=80, block_size=16, splits=4),
          dict(head_dim=192, value_head_dim=128), dict(head_dim=72, q_len=4)]:
    k, m = compile_decode("sm_90", dtype="bfloat16", **c)
    t = sass(k)
    print(c, {x: len(re.findall(x, t)) for x in ["HGMMA", "WARPGROUP.DEPBAR", "UTMALDG", "LDSM", "STS", "LDS\\b"]}, resource_usage(k))
