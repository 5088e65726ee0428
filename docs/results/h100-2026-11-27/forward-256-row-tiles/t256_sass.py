"""Step 9 on 256-row tiles, compile-only (sm_90, bf16, eight worker warps): registers, stack, shared memory, products and waits."""
import re
from cutile_fmha.steps.compile import export_cubin, sass, resource_usage
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.family import forward_constants
from cutile_fmha.steps.launcher import kernel_for
from cutile_fmha.platforms.entry import TileShape
for d, tm, tn, occ in ((64, 256, 64, 1), (64, 256, 128, 1), (64, 256, 64, 2), (128, 256, 64, 1)):
    for causal in (False, True):
        hints = {"occupancy": occ, "num_worker_warps": 8, "num_ctas": None}
        c = forward_constants(d, TileShape(tm, tn), causal=causal, write_lse=False)
        cub = export_cubin(kernel_for(9, hints), STEPS[9].family, dtype="bfloat16", constants=c, arch="sm_90", rows_multiple=16)
        s = sass(cub)
        cnt = {k: len(re.findall(re.escape(k), s)) for k in ("HGMMA", "WARPGROUP.DEPBAR", "LDL", "STL")}
        print(d, causal, f"{tm}x{tn} occ{occ}", resource_usage(cub).split(" CONST")[0], cnt, flush=True)
