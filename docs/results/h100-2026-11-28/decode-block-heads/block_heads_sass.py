"""Compile-only (sm_90): the block-heads probe (block_heads.py) against the package's
decode kernel on the same paged cache (blocks of 16, 32/8 heads, D=128, bf16, one new
token, split): registers, stack, shared memory and instruction counts.

    python block_heads_sass.py > block-heads-sass-tileiras-13.5.txt
"""
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from block_heads import block_heads_family, decode_block_heads  # noqa: E402
from cutile_fmha.kernels import decode as decode_kernels  # noqa: E402
from cutile_fmha.platforms import entry_for  # noqa: E402
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass  # noqa: E402
from cutile_fmha.steps.decode import DecodeShape, decode_plan  # noqa: E402
from cutile_fmha.steps.family import DECODE  # noqa: E402
from cutile_fmha.steps.launcher import with_hints  # noqa: E402

KEYS = ("HGMMA", "WARPGROUP.DEPBAR", "UTMALDG", "LDG", "LDS", "STS", "LDSM", "SYNCS",
        "BAR.SYNC", "MUFU.EX2", "LDL", "STL", "USETMAXREG")


def report(name, cubin):
    code = sass(cubin)
    counts = {k: len(re.findall(r"\b" + re.escape(k) + r"\b", code)) for k in KEYS}
    print(name, resource_usage(cubin).split(" CONST")[0], counts, flush=True)


print(subprocess.run(["tileiras", "--version"], capture_output=True, text=True).stdout.strip())
for block in (16, 32):
    shape = DecodeShape(batch=1, head_dim=128, kv_heads=8, group=4, q_len=1, capacity=4096,
                        block_size=block, causal=False, has_starts=False, has_lengths=True,
                        write_lse=False, num_splits=16)
    plan = decode_plan(shape, entry_for("sm_90").decode[128], sms=132, device=None)
    report(f"package blocks of {block} {plan.hints}",
           export_cubin(with_hints(decode_kernels.decode, plan.hints), DECODE,
                        dtype="bfloat16", constants=plan.constants, arch="sm_90"))
    for hints in ({"occupancy": 2}, {"occupancy": 1, "num_worker_warps": 8}):
        for heads in (8, 4):
            constants = {"TILE_D": 128, "BLOCK_SIZE": block, "HEADS": heads, "QUERY_GROUP": 4,
                         "COLUMNS": max(heads * 4, 8), "SPLIT": True, "WRITE_LSE": False}
            try:
                cubin = export_cubin(with_hints(decode_block_heads, hints), block_heads_family(),
                                     dtype="bfloat16", constants=constants, arch="sm_90")
            except Exception as e:  # noqa: BLE001
                print(f"block heads {heads} blocks of {block} {hints}: failed {e!s:.300}")
                continue
            report(f"block heads {heads} blocks of {block} {hints}", cubin)
