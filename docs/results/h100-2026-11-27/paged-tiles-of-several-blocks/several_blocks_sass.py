"""Compile-only (sm_90): paged caches with the columns on the M side at the table's
launches (tiles of tile_n keys, of several blocks where blocks are shorter): registers,
stack, producer warp (USETMAXREG), warpgroup products and waits, TMA loads."""
import re
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.decode import DecodeShape, decode_plan
from cutile_fmha.steps.compile import export_cubin, sass, resource_usage
from cutile_fmha.steps.family import DECODE
for d in (64, 128, 256):
    launch = entry_for("sm_90").decode[d]
    for q in (16, 32):
        for bs in (16, 32, 64, 256):
            for splits in (1, 4):
                shape = DecodeShape(batch=1, head_dim=d, kv_heads=8, group=4, q_len=q, capacity=splits * 4096,
                                    block_size=bs, causal=True, has_starts=False, has_lengths=True,
                                    write_lse=False, num_splits=splits)
                plan = decode_plan(shape, launch, sms=132, device=None)
                cubin = export_cubin(plan.kernel, DECODE, dtype="bfloat16", constants=plan.constants, arch="sm_90")
                code, res = sass(cubin), resource_usage(cubin)
                regs = re.search(r"REG:(\d+)", res).group(1); stack = re.search(r"STACK:(\d+)", res).group(1)
                counts = {k: code.count(k) for k in ("USETMAXREG", "HGMMA", "DEPBAR", "UTMALDG", "SHFL")}
                print(f"D={d} q_len={q} block={bs} splits={splits} on_m={plan.constants['QUERIES_ON_M']} "
                      f"tile={plan.constants['TILE_N']} REG {regs} STACK {stack}", counts, flush=True)
