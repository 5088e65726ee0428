import dataclasses
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps import compile as C
from cutile_fmha.steps.decode import DecodeShape, decode_plan
for D in (64, 128, 256):
    base = entry_for("sm_90").decode[D]
    for name, launch in (("table", base), ("64 o1 w8", dataclasses.replace(base, occupancy=1, num_worker_warps=8, tile_n=64))):
        for block in (None, 16, 64):
            for splits in (1, 16):
                shape = DecodeShape(batch=16, head_dim=D, kv_heads=8, group=4, q_len=8, capacity=4096,
                                    block_size=block, causal=True, has_starts=False, has_lengths=True,
                                    write_lse=False, num_splits=splits)
                plan = decode_plan(shape, launch, sms=132, device=None)
                cub = C.export_cubin(plan.kernel, C.DECODE, dtype="bfloat16", constants=plan.constants, arch="sm_90")
                print(f"D={D} 32 columns {name} {'dense' if block is None else f'paged {block}'} splits {splits}:",
                      C.resource_usage(cub).split(" LOCAL")[0], "warp-specialized" if "USETMAXREG" in C.sass(cub) else "no producer warp", flush=True)
