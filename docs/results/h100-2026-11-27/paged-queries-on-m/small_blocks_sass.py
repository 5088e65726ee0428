"""Compile-only (sm_90): paged blocks of 16 and 32 with the columns on the M side
(rows_block_size=16, tiles of one block) against the transposed products (rows_block_size=64)."""
import re, dataclasses
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_plan
from cutile_fmha.steps.compile import export_cubin, sass, resource_usage
from cutile_fmha.steps.family import DECODE
for d in (128, 64, 256):
    base = entry_for("sm_90").decode[d]
    for q in (16, 32):
        for bs in (16, 32):
            for splits in (1, 4):
                for rows in (64, 16):
                    launch = dataclasses.replace(base, rows_block_size=rows)
                    shape = DecodeShape(batch=1, head_dim=d, kv_heads=8, group=4, q_len=q, capacity=splits * 4096,
                                        block_size=bs, causal=True, has_starts=False, has_lengths=True,
                                        write_lse=False, num_splits=splits)
                    plan = decode_plan(shape, launch, sms=132, device=None)
                    cubin = export_cubin(plan.kernel, DECODE, dtype="bfloat16", constants=plan.constants, arch="sm_90")
                    code, res = sass(cubin), resource_usage(cubin)
                    regs = re.search(r"REG:(\d+)", res).group(1); stack = re.search(r"STACK:(\d+)", res).group(1)
                    counts = {k: code.count(k) for k in ("USETMAXREG", "HGMMA", "UTMALDG", "SHFL", "DEPBAR")}
                    print(f"D={d} q={q} block={bs} splits={splits} rows={plan.constants['QUERIES_ON_M']} tile={plan.constants['TILE_N']} "
                          f"REG {regs} STACK {stack}", counts, flush=True)
