"""Registers and stack frame of every "dkdv_dq" candidate of the D=256 search (eight worker
warps), compiled for sm_90 by the tileiras first on PATH (here 13.4, as on the GPU)."""
import re, sys
import cuda.tile._compile as cc
cc._find_pip_tileiras = lambda: None
from cutile_fmha.platforms.backward import BackwardLaunch
from cutile_fmha.platforms.entry import TileShape
from cutile_fmha.steps.backward import gradient_launch, backward_kernel, BACKWARD_FAMILIES
from cutile_fmha.steps.compile import export_cubin, resource_usage
import importlib.util
spec = importlib.util.spec_from_file_location("autotune", "assets/fmha_autotune.py"); at = importlib.util.module_from_spec(spec); spec.loader.exec_module(at)
for tm, tn in [(64,64),(64,128),(128,64),(128,128),(32,128),(128,32),(16,128)]:
    entry = at.backward_candidate_entry("sm_90", 256, "dkdv_dq", BackwardLaunch(TileShape(tm,tn), 8))
    for causal in (True, False):
        launch, constants = gradient_launch(entry, "dkdv_dq", 256, 256, query_group=1, causal=causal)
        c = export_cubin(backward_kernel("dkdv_dq", 8), BACKWARD_FAMILIES["dkdv_dq"], dtype="bfloat16", constants=constants, arch="sm_90")
        print(tm, tn, causal, re.search(r"REG:\d+ STACK:\d+", resource_usage(c)).group(0), flush=True)
