import dataclasses, sys
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps import compile as C
from cutile_fmha.steps.decode import DecodeShape, decode_plan
for D, q_len, launches in ((256, 1, ("table", "o1 w8")), (256, 4, ("table", "o1 w8")), (256, 16, ("table", "o1 w8")),
                           (128, 16, ("table", "o1 w8", "64 o1 w8")), (128, 4, ("table", "o1 w8")), (128, 1, ("table", "o1 w8"))):
    base = dataclasses.replace(entry_for("sm_90").decode[D], one_wave_columns=None)
    for name in launches:
        launch = {"table": base, "o1 w8": dataclasses.replace(base, occupancy=1, num_worker_warps=8),
                  "64 o1 w8": dataclasses.replace(base, occupancy=1, num_worker_warps=8, tile_n=64)}[name]
        for splits in (1, 16):
            shape = DecodeShape(batch=16, head_dim=D, kv_heads=8, group=4, q_len=q_len, capacity=splits * 4096,
                                block_size=None, causal=True, has_starts=False, has_lengths=True,
                                write_lse=False, num_splits=splits)
            plan = decode_plan(shape, launch, sms=132, device=None)
            cub = C.export_cubin(plan.kernel, C.DECODE, dtype="bfloat16", constants=plan.constants, arch="sm_90")
            print(f"D={D} q_len {q_len} ({plan.constants['GROUP_TILE'] * plan.constants['QUERY_ROWS']} columns) {name} splits {splits}:",
                  C.resource_usage(cub).split(" LOCAL")[0], "warp-specialized" if "USETMAXREG" in C.sass(cub) else "no producer warp", flush=True)
