"""What a ct.mma of (M, 128) by (128, 8) bf16 tiles compiles to for sm_90 at M = 16, 32, 64:
the warpgroup product (HGMMA) from 64 rows, FFMAs below."""
import re, collections
import cuda.tile as ct
from cutile_fmha.steps.compile import sass
from cutile_fmha.steps.family import Tensor
ConstInt = ct.Constant[int]

@ct.kernel
def k16(A, B, C, M: ConstInt):
    a = ct.load(A, index=(0, 0), shape=(M, 128))
    b = ct.load(B, index=(0, 0), shape=(128, 8))
    c = ct.mma(a, b, ct.full((M, 8), 0.0, dtype=ct.float32))
    ct.store(C, index=(0, 0), tile=c)
from cutile_fmha.steps.family import KernelFamily, Constant
from cutile_fmha.steps.compile import export_cubin
fam = KernelFamily("probe", (Tensor("A", 2), Tensor("B", 2), Tensor("C", 2, ct.float32), Constant("M")), grid=lambda v: (1, 1, 1))
for M in (16, 64):
    text = sass(export_cubin(k16, fam, dtype="bfloat16", constants={"M": M}, arch="sm_90"))
    ops = collections.Counter(m.group(1).split('.')[0] for m in re.finditer(r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", text))
    print(M, {k: v for k, v in ops.items() if "MMA" in k or k in ("UTMALDG", "LDSM", "WARPGROUP")})
    print([l.strip() for l in text.splitlines() if "MMA" in l][:3])
for M in (16, 32):
    text = sass(export_cubin(k16, fam, dtype="bfloat16", constants={"M": M}, arch="sm_90"))
    ops = collections.Counter(m.group(1).split('.')[0] for m in re.finditer(r"/\*[0-9a-f]{4,6}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", text))
    print(M, ops.most_common(8))
