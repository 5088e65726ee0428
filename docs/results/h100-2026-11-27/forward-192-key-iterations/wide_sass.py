"""Compile-only: the probe's kernels for sm_90, registers, stack, HGMMA and waits."""
import re, sys
sys.path.insert(0, "docs/results/h100-2026-11-27/forward-192-key-iterations")
import wide_keys
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.launcher import with_hints

fam = STEPS[9].family
for tile_m, hints in ((128, {"occupancy": 1, "num_worker_warps": 8}),
                      (64, {"occupancy": 2, "num_worker_warps": None})):
    for tile_n in (128, 192):
        c = {"TILE_D": 128, "TILE_M": tile_m, "TILE_N": tile_n, "QUERY_GROUP": 1, "CAUSAL": False,
             "WRITE_LSE": False}
        cub = export_cubin(with_hints(wide_keys.fmha, hints), fam, dtype="bfloat16", constants=c, arch="sm_90")
        code = sass(cub)
        print(tile_m, tile_n, hints, re.search(r"REG:\d+ STACK:\d+", resource_usage(cub)).group(0),
              "HGMMA", code.count("HGMMA"), "DEPBAR", code.count("WARPGROUP.DEPBAR"),
              "MUFU.EX2", code.count("MUFU.EX2"), "USETMAXREG", "USETMAXREG" in code, flush=True)
