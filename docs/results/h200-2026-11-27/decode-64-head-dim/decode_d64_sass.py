import dataclasses, re
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps import compile as C
from cutile_fmha.steps.decode import DecodeShape, decode_plan
D = 64
base = dataclasses.replace(entry_for("sm_90").decode[D], one_wave_columns=None)
V = {"table": base, "o1 w8": dataclasses.replace(base, occupancy=1, num_worker_warps=8),
     "64 o1 w8": dataclasses.replace(base, occupancy=1, num_worker_warps=8, tile_n=64),
     "256 o1 w8": dataclasses.replace(base, occupancy=1, num_worker_warps=8, tile_n=256),
     "256 o2": dataclasses.replace(base, tile_n=256),
     "64 o2": dataclasses.replace(base, tile_n=64),
     "o2 w4": dataclasses.replace(base, num_worker_warps=4)}
for q_len in (8, 16):
    for name, launch in V.items():
        shape = DecodeShape(batch=16, head_dim=D, kv_heads=8, group=4, q_len=q_len, capacity=4096,
                            block_size=None, causal=True, has_starts=False, has_lengths=True,
                            write_lse=False, num_splits=1)
        plan = decode_plan(shape, launch, sms=132, device=None)
        cub = C.export_cubin(plan.kernel, C.DECODE, dtype="bfloat16", constants=plan.constants, arch="sm_90")
        sass = C.sass(cub)
        ops = {op: len(re.findall(op, sass)) for op in ("HGMMA", "SHFL", "MUFU.EX2", "BAR.SYNC", "LDL", "STL")}
        print(f"D={D} {4 * q_len} columns {name}: TILE_N {plan.constants['TILE_N']}", C.resource_usage(cub).split(" LOCAL")[0],
              "warp-specialized" if "USETMAXREG" in sass else "no producer warp", ops, flush=True)
