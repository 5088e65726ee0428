"""Compile-only: a CTA adds a float32 tile by a tiled view's atomic_store_add (TMA reduction
where it can), then bumps a counter with ct.atomic_add (acq_rel, device); the CTA that
finds the count complete loads the sums and stores them as bf16. What does sm_90's SASS
put between the reduction and the counter?"""
import re
import subprocess
import tempfile

import cuda.tile as ct
from cutile_fmha.kernels.common import ConstInt
from cutile_fmha.steps.compile import export_cubin
from cutile_fmha.steps.family import Constant, KernelFamily, Tensor

@ct.kernel
def last_casts(Acc, Count, Out, TILE_M: ConstInt, TILE_D: ConstInt, ADDERS: ConstInt):
    tile = ct.bid(0)
    part = ct.full((TILE_M, TILE_D), 1.0, dtype=ct.float32)
    Acc.tiled_view((TILE_M, TILE_D)).atomic_store_add((tile, 0), part)
    old = ct.atomic_add(Count, tile, 1)
    if old == ADDERS - 1:
        sums = ct.load(Acc, index=(tile, 0), shape=(TILE_M, TILE_D))
        ct.store(Out, index=(tile, 0), tile=sums.astype(Out.dtype))

FAMILY = KernelFamily(name="probe", parameters=(
    Tensor("Acc", 2, ct.float32, head_dim_last=True), Tensor("Count", 1, ct.int32, aligned=False),
    Tensor("Out", 2, head_dim_last=True), Constant("TILE_M"), Constant("TILE_D"), Constant("ADDERS")),
    grid=lambda v: (1, 1, 1))
cubin = export_cubin(last_casts, FAMILY, dtype="bfloat16", constants={"TILE_M": 64, "TILE_D": 128, "ADDERS": 4}, arch="sm_90")
with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(cubin); f.flush()
    sass = subprocess.run(["cuobjdump", "--dump-sass", f.name], capture_output=True, text=True).stdout
lines = [l.strip() for l in sass.splitlines() if re.search(r"/\*[0-9a-f]{4}\*/", l)]
for l in lines:
    op = re.sub(r"^/\*[0-9a-f]+\*/\s*", "", l)
    if re.search(r"UTMA|RED|ATOM|MEMBAR|FENCE|SYNCS|DEPBAR|BAR|CCTL|ERRBAR|UBLKRED|LDG|STG|UTMASTG|UTMALDG|EXIT|BRA", op):
        print(op[:110])
