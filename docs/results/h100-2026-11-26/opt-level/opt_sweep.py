"""Compile-only: the sm_90 machine code of the sm_90 table's launches (step 9's forward and
"dkdv_dq" at D=64/128/256, causal and not; D=128's dK/dV, dQ and decode kernels) at one
tileiras optimization level (cuda.tile's opt_level, 0-3, default 3), bf16. One process per
level and compiler, each with a cache of its own (cuTile's cache key leaves the level out
when it is forced here):
    OPT=1 CUDA_TILE_CACHE_DIR=/tmp/o1 python opt_sweep.py
    NO_PIP_TILEIRAS=1 PATH=<13.4 toolchain>/bin:$PATH OPT=1 CUDA_TILE_CACHE_DIR=... python opt_sweep.py"""
import json, os, re
import cuda.tile._compile as C
OPT = int(os.environ["OPT"])
C._tileiras_effective_opt_and_device_debug = lambda o, a: (OPT, False)
if os.environ.get("NO_PIP_TILEIRAS"):
    C._find_pip_tileiras = lambda: None
from cutile_fmha.steps.compile import compile_backward, compile_step, compile_decode, resource_usage, sass
version = C._get_compiler_version_string().split("release ")[1].split(",")[0]
cases = [("forward step 9", d, causal) for d in (64, 128, 256) for causal in (True, False)]
cases += [("dkdv_dq", d, causal) for d in (64, 128, 256) for causal in (True, False)]
cases += [("dkdv", 128, True), ("dq", 128, True), ("decode", 128, True)]
for kernel, d, causal in cases:
    if kernel.startswith("forward"):
        cubin = compile_step(9, "sm_90", dtype="bfloat16", head_dim=d, causal=causal)
    elif kernel == "decode":
        cubin = compile_decode("sm_90", dtype="bfloat16", head_dim=d, causal=causal)[0]
    else:
        cubin = compile_backward(kernel, "sm_90", dtype="bfloat16", head_dim=d, causal=causal)
    code = sass(cubin)
    usage = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", resource_usage(cubin)))
    print(json.dumps({"tileiras": version, "opt_level": OPT, "kernel": kernel, "head_dim": d,
                      "causal": causal, **{k: int(v) for k, v in usage.items()},
                      "instructions": len(re.findall(r"/\*[0-9a-f]{4,}\*/", code)),
                      "HGMMA": code.count("HGMMA."), "waits": code.count("WARPGROUP.DEPBAR")}), flush=True)
