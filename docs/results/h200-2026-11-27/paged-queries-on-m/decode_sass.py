import sys, re, collections
from cutile_fmha.steps.compile import compile_decode, sass, resource_usage
bs = None if sys.argv[1] == "dense" else int(sys.argv[1])
splits = int(sys.argv[2]) if len(sys.argv) > 2 else 16
qlen = int(sys.argv[3]) if len(sys.argv) > 3 else 1
cub, _ = compile_decode("sm_90", dtype="bfloat16", head_dim=128, block_size=bs, splits=splits, q_len=qlen, causal=True)
print(resource_usage(cub))
text = sass(cub)
ops = collections.Counter()
for line in text.splitlines():
    m = re.search(r"/\*[0-9a-f]{4,6}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)(\.[A-Z0-9_.x]+)?", line)
    if m: ops[m.group(2)] += 1
for k in ("HGMMA","WARPGROUP","UTMALDG","LDS","LDSM","STS","STSM","LDG","SYNCS","MUFU","BAR","FFMA","SHFL"):
    print(k, ops.get(k, 0))
print("total", sum(ops.values()))
if "--dump" in sys.argv: open("/tmp/decode.sass","w").write(text)
