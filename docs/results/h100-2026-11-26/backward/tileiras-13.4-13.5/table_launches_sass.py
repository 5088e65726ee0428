"""Compile-only: the sm_90 machine code of every launch the sm_90 table runs for the forward
(step 9, the fastest step) and the backward (dK/dV, dQ, "dkdv_dq"), bf16, causal and not,
under the tileiras this process finds: registers, stack frame, shared memory, warpgroup
products, their waits and how dQ is added. Run once per compiler, e.g.
    NO_PIP_TILEIRAS=1 PATH=<13.4 toolchain>/bin:$PATH python table_launches_sass.py
(cuda.tile prefers the pip compiler; NO_PIP_TILEIRAS makes it take PATH's)."""
import json
import os
import re

import cuda.tile._compile as compile_

if os.environ.get("NO_PIP_TILEIRAS"):
    compile_._find_pip_tileiras = lambda: None

from cutile_fmha.steps.compile import compile_backward, compile_step, resource_usage, sass

version = compile_._get_compiler_version_string().split("release ")[1].split(",")[0]
cases = [("forward step 9", d, d, causal) for d in (64, 128, 256) for causal in (True, False)]
cases += [(kernel, d, d, causal) for kernel in ("dkdv", "dq", "dkdv_dq")
          for d in (64, 128, 256) for causal in (True, False)]
cases += [("dkdv_dq", 192, 128, causal) for causal in (True, False)]
for kernel, d_qk, d_v, causal in cases:
    if kernel.startswith("forward"):
        cubin = compile_step(9, "sm_90", dtype="bfloat16", head_dim=d_qk, causal=causal)
    else:
        cubin = compile_backward(kernel, "sm_90", dtype="bfloat16", head_dim=d_qk,
                                 value_head_dim=d_v, causal=causal)
    code = sass(cubin)
    usage = dict(re.findall(r"(REG|STACK|SHARED):(\d+)", resource_usage(cubin)))
    print(json.dumps({"tileiras": version, "kernel": kernel, "head_dims": f"{d_qk}/{d_v}",
                      "causal": causal, **{k: int(v) for k, v in usage.items()},
                      "HGMMA": code.count("HGMMA."), "waits": code.count("WARPGROUP.DEPBAR"),
                      "REDG": len(re.findall(r"\bREDG\.", code)),
                      "UTMAREDG": code.count("UTMAREDG")}), flush=True)
