"""Compile-only (sm_90): the decode kernel at the table's launch for one new token, 32/8
heads, D=128, bf16, a dense cache, with and without 2-CTA clusters (`num_ctas=2`):
registers, stack, shared memory and instruction counts.

    python cluster_sass.py > cluster-sass-tileiras-13.5.txt
"""
import re
import subprocess
from cutile_fmha.kernels import decode as decode_kernels
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass
from cutile_fmha.steps.decode import DecodeShape, decode_plan
from cutile_fmha.steps.family import DECODE
from cutile_fmha.steps.launcher import with_hints

print(subprocess.run(["tileiras", "--version"], capture_output=True, text=True).stdout.strip())
shape = DecodeShape(batch=16, head_dim=128, kv_heads=8, group=4, q_len=1, capacity=4096,
                    block_size=None, causal=False, has_starts=False, has_lengths=True,
                    write_lse=False, num_splits=1)
plan = decode_plan(shape, entry_for("sm_90").decode[128], sms=132, device=None)
for extra in ({}, {"num_ctas": 2}):
    hints = plan.hints | extra
    cubin = export_cubin(with_hints(decode_kernels.decode, hints), DECODE, dtype="bfloat16",
                         constants=plan.constants, arch="sm_90")
    code = sass(cubin)
    counts = {k: len(re.findall(re.escape(k), code)) for k in
              ("HGMMA", "WARPGROUP.DEPBAR", "UTMALDG", "MULTICAST", "UCGABAR", "MEMBAR",
               "SYNCS", "BAR.SYNC", "LDL", "STL")}
    print(hints, resource_usage(cubin).split(" CONST")[0], counts, flush=True)
