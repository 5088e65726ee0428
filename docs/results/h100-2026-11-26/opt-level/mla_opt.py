"""Compile-only: "dkdv_dq" for D_qk=192, D_v=128 on 64x128 tiles with eight worker warps (the
launch that spills under tileiras 13.5) at one optimization level, bf16, causal and not:
    OPT=1 CUDA_TILE_CACHE_DIR=/tmp/m1 python mla_opt.py"""
import os, re, json
import cuda.tile._compile as C
OPT = int(os.environ["OPT"])
C._tileiras_effective_opt_and_device_debug = lambda o, a: (OPT, False)
import cutile_fmha.steps.compile as SC
from cutile_fmha.platforms.backward import with_launches, backward_entry_for, BackwardLaunch
from cutile_fmha.platforms.entry import TileShape
base = backward_entry_for("sm_90")
entry = with_launches(base, {((192, 128), "dkdv_dq"): BackwardLaunch(TileShape(64, 128), 8)}, "probe")
SC.backward_entry_for = lambda arch: entry
for causal in (True, False):
    cubin = SC.compile_backward("dkdv_dq", "sm_90", dtype="bfloat16", head_dim=192, value_head_dim=128, causal=causal)
    code = SC.sass(cubin)
    usage = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", SC.resource_usage(cubin)))
    print(json.dumps({"opt": OPT, "causal": causal, **usage, "HGMMA": code.count("HGMMA."), "waits": code.count("WARPGROUP.DEPBAR")}), flush=True)
