"""Compile-only, sm_90: the decode kernel at 64 and 128 columns on a dense cache, with the
columns on the products' M side (the table's launch now) and transposed (rows_columns
None: the launches before), D 64/128/256, causal, one split and four."""
import dataclasses, re
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass
from cutile_fmha.steps.decode import DecodeShape, decode_plan
from cutile_fmha.steps.family import DECODE

for head_dim in (64, 128, 256):
    for q_len in (16, 32):  # 64 and 128 columns at 4 query heads a K/V head
        for splits in (1, 4):
            for rows in (True, False):
                launch = entry_for("sm_90").decode[head_dim]
                if not rows:
                    launch = dataclasses.replace(launch, rows_columns=None)
                shape = DecodeShape(batch=1, head_dim=head_dim, kv_heads=8, group=4, q_len=q_len,
                                    capacity=splits * 4096, block_size=None, causal=True,
                                    has_starts=False, has_lengths=True, write_lse=False,
                                    num_splits=splits)
                plan = decode_plan(shape, launch, sms=132, device=None)
                cubin = export_cubin(plan.kernel, DECODE, dtype="bfloat16",
                                     constants=plan.constants, arch="sm_90")
                code = sass(cubin)
                counts = {name: len(re.findall(name, code)) for name in
                          ("HGMMA", "WARPGROUP.DEPBAR", "MUFU.EX2", "SHFL", "USETMAXREG")}
                usage = " ".join(resource_usage(cubin).split()[:3])
                print(f"D={head_dim} columns={4 * q_len} splits={splits} "
                      f"{'M side' if rows else 'transposed'} tile_n={plan.constants['TILE_N']} "
                      f"{plan.hints}: {usage} {counts}", flush=True)
