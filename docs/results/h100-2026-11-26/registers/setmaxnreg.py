"""Compile-only: the registers a launch starts with (cuobjdump) against what its warpgroups
take in the sm_90 SASS (USETMAXREG: the producer gives back, the consumers allocate), under
the tileiras this process finds; bf16 unless named."""
import dataclasses
import json
import re

from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.entry import TileShape, TunedLaunch
from cutile_fmha.steps.compile import (compile_backward, compile_decode, compile_fp8,
                                       compile_step, resource_usage, sass)

table = entry_for("sm_90")
fp8_128x128 = dataclasses.replace(table, fp8_tuned=table.fp8_tuned | {
    (256, True): TunedLaunch(9, TileShape(128, 128), 1, 8)})
fwd_four_warps = dataclasses.replace(table, tuned=table.tuned | {
    (128, True): TunedLaunch(9, TileShape(128, 128), 1, 4)})
cases = {
    "step 9, D=128 causal": lambda: compile_step(9, "sm_90", dtype="bfloat16", head_dim=128,
                                                 causal=True),
    "step 9, D=128 non-causal (two CTAs per SM)": lambda: compile_step(
        9, "sm_90", dtype="bfloat16", head_dim=128, causal=False),
    "step 9, D=128 causal, 128x128, four worker warps": lambda: compile_step(
        9, "sm_90", dtype="bfloat16", head_dim=128, causal=True, entry=fwd_four_warps),
    "dkdv_dq, D=128 non-causal": lambda: compile_backward("dkdv_dq", "sm_90", dtype="bfloat16",
                                                          head_dim=128, causal=False),
    "dkdv, D=128 causal": lambda: compile_backward("dkdv", "sm_90", dtype="bfloat16",
                                                   head_dim=128, causal=True),
    "decode, D=128": lambda: compile_decode("sm_90", dtype="bfloat16", head_dim=128)[0],
    "FP8, D=256 causal (64x256)": lambda: compile_fp8("sm_90", head_dim=256, causal=True),
    "FP8, D=256 causal, 128x128": lambda: compile_fp8("sm_90", head_dim=256, causal=True,
                                                      entry=fp8_128x128),
}
for name, compile_ in cases.items():
    cubin = compile_()
    code = sass(cubin)
    usage = dict(re.findall(r"(REG|STACK):(\d+)", resource_usage(cubin)))
    moves = sorted({(kind, int(value, 16)) for kind, value in
                    re.findall(r"USETMAXREG\.(\w+)\.CTAPOOL (?:UP0, )?(0x[0-9a-f]+)", code)})
    print(json.dumps({"kernel": name, "launch_registers": int(usage["REG"]),
                      "stack": int(usage["STACK"]), "setmaxnreg": moves}), flush=True)
