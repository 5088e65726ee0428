"""Compile-only (sm_90): "dkdv_dq" without the causal mask at D=64, 128 and 256, bf16 inputs,
with dK/dV arrays of bf16 (one launch) and of float32 (a chunk's partial sums): registers,
stack, shared memory and the warpgroup products and waits of each."""

import io
import json
import re

import cuda.tile as ct
from cuda.tile.compilation import export_kernel

from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, backward_kernel, gradient_launch
from cutile_fmha.steps.compile import resource_usage, sass

family = BACKWARD_FAMILIES["dkdv_dq"]
for head_dim in (64, 128, 256):
    launch, constants = gradient_launch(backward_entry_for("sm_90"), "dkdv_dq", head_dim,
                                        head_dim, query_group=1, causal=False)
    for out_dtype in ("bfloat16", "float32"):
        signature = family.signature(ct.bfloat16, constants)
        parameters = list(signature.parameters)
        for name in ("dK", "dV"):
            tensor = next(p for p in family.parameters if p.name == name)
            parameters[family.names.index(name)] = tensor.constraint(getattr(ct, out_dtype))
        signature = type(signature)(parameters, signature.calling_convention)
        buffer = io.BytesIO()
        export_kernel(backward_kernel("dkdv_dq", launch.num_worker_warps), [signature], buffer,
                      gpu_code="sm_90", output_format="cubin")
        cubin = buffer.getvalue()
        usage, code = resource_usage(cubin), sass(cubin)
        print(json.dumps({
            "head_dim": head_dim, "dK/dV": out_dtype,
            "registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "shared": int(re.search(r"SHARED:(\d+)", usage).group(1)),
            "HGMMA": len(re.findall(r"\bHGMMA\.", code)),
            "WARPGROUP.DEPBAR": len(re.findall(r"WARPGROUP\.DEPBAR", code)),
            "UTMASTG": len(re.findall(r"\bUTMASTG", code)),
            "STG": len(re.findall(r"\bSTG\.", code))}), flush=True)
