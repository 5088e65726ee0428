"""Compile-only (sm_90, tileiras 13.5, bf16 unless named): launches with 16 worker warps
(four consumer warpgroups), which cuda-tile 1.7.0 compiles only from Tile IR bytecode 13.5,
written only with its development features on (turned on here, a private switch). Prints
registers, stack, shared memory, warpgroup products and their waits, and the consumers'
register allocation (USETMAXREG.TRY_ALLOC); then the table's launches written as bytecode
13.4 and 13.5, whose sm_90 code is compared instruction for instruction.

    python w16_sass.py > w16-sass-tileiras-13.5.txt
"""
import cuda.tile._compile as tile_compile
tile_compile.dev_features_enabled = lambda: True
import dataclasses, hashlib, io, re
from cuda.tile.compilation import export_kernel
from cutile_fmha.steps.compile import CT_DTYPES, resource_usage, sass
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, backward_kernel, gradient_launch
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.family import FORWARD_FP8, forward_constants
from cutile_fmha.steps.fp8 import fp8_kernel
from cutile_fmha.steps.launcher import kernel_for
from cutile_fmha.platforms import entry_for
from cutile_fmha.platforms.backward import SM_90
from cutile_fmha.platforms.entry import TileShape, TunedLaunch

TABLE = entry_for("sm_90")


def cubin(kernel, family, dtype, constants, bytecode="13.5"):
    buf = io.BytesIO()
    export_kernel(kernel, [family.signature(CT_DTYPES[dtype], constants, 16)], buf,
                  gpu_code="sm_90", output_format="cubin", bytecode_version=bytecode)
    return buf.getvalue()


def report(label, build):
    try:
        code = build()
    except Exception as e:  # tileiras refuses some shapes ("Return code 5")
        print(label, "failed:", str(e)[:120].replace("\n", " "), flush=True)
        return
    s = sass(code)
    counts = {k: len(re.findall(re.escape(k), s)) for k in
              ("HGMMA", "QGMMA", "WARPGROUP.DEPBAR", "LDL", "STL", "MUFU.EX2")}
    alloc = re.findall(r"USETMAXREG\.TRY_ALLOC\.CTAPOOL \w+, (0x[0-9a-f]+)", s)
    print(label, resource_usage(code).split(" CONST")[0], counts, "consumers' registers",
          [int(a, 16) for a in alloc], flush=True)


def forward(d, causal, tm, tn, warps, occupancy=1, step=9, bytecode="13.5"):
    hints = {"occupancy": occupancy, "num_worker_warps": warps, "num_ctas": None}
    return cubin(kernel_for(step, hints), STEPS[step].family, "bfloat16",
                 forward_constants(d, TileShape(tm, tn), causal=causal, write_lse=False), bytecode)


def fp8(d, causal, tm, tn, warps):
    e = dataclasses.replace(TABLE, fp8_tuned=TABLE.fp8_tuned | {
        (d, causal): TunedLaunch(9, TileShape(tm, tn), 1, warps, None, 0)})
    kernel, constants = fp8_kernel(e, head_dim=d, causal=causal, query_group=1, write_lse=False)
    return cubin(kernel, FORWARD_FP8, "float8_e4m3fn", constants)


def backward(name, d, causal, tm, tn, warps):
    launches = {h: dict(v) for h, v in SM_90.launches.items()}
    launches[d][name] = dataclasses.replace(launches[d][name], tiles=TileShape(tm, tn),
                                            num_worker_warps=warps)
    _, constants = gradient_launch(dataclasses.replace(SM_90, launches=launches), name, d, d,
                                   query_group=1, causal=causal)
    return cubin(backward_kernel(name, warps), BACKWARD_FAMILIES[name], "bfloat16", constants)


print("## step 9 forward, 16 worker warps")
for d, tm, tn in ((64, 256, 64), (64, 256, 32), (64, 256, 128), (64, 512, 64), (128, 256, 64),
                  (128, 256, 32), (128, 256, 128), (256, 256, 32)):
    for causal in (False, True):
        report(f"D={d} {'causal' if causal else 'not causal'} {tm}x{tn}",
               lambda: forward(d, causal, tm, tn, 16 if tm == 256 else 32))
print("## FP8 forward, 16 worker warps")
for d, tm, tn in ((64, 256, 128), (128, 256, 64), (128, 256, 128), (256, 256, 64)):
    report(f"FP8 D={d} not causal {tm}x{tn}", lambda: fp8(d, False, tm, tn, 16))
print("## backward, causal (query rows x keys), 16 worker warps; the table's first")
for name, d, tm, tn, warps in (("dkdv_dq", 64, 128, 128, 8), ("dkdv_dq", 64, 128, 256, 16),
                               ("dkdv_dq", 64, 64, 256, 16), ("dkdv_dq", 64, 32, 256, 16),
                               ("dkdv_dq", 128, 64, 128, 8), ("dkdv_dq", 128, 64, 256, 16),
                               ("dkdv_dq", 128, 32, 256, 16), ("dq", 64, 256, 64, 16),
                               ("dq", 128, 256, 64, 16), ("dkdv", 128, 32, 256, 16)):
    report(f"{name} D={d} {tm}x{tn} {warps} warps", lambda: backward(name, d, True, tm, tn, warps))
print("## the table's forward launches, bytecode 13.4 against 13.5")
for d in (64, 128, 256):
    for causal in (False, True):
        launch = TABLE.tuned_launch(d, causal)
        digests = []
        for bytecode in ("13.4", "13.5"):
            s = sass(forward(d, causal, launch.tiles.tile_m, launch.tiles.tile_n,
                             launch.num_worker_warps, launch.occupancy, launch.step, bytecode))
            body = "\n".join(re.sub(r"/\*[0-9a-f]+\*/", "", line).strip()
                             for line in s.splitlines() if "/*" in line)
            digests.append(hashlib.md5(body.encode()).hexdigest()[:12])
        print(f"D={d} {'causal' if causal else 'not causal'} step {launch.step} "
              f"{launch.tiles.tile_m}x{launch.tiles.tile_n} occupancy {launch.occupancy} "
              f"warps {launch.num_worker_warps}: 13.4 {digests[0]}, 13.5 {digests[1]}",
              "same" if digests[0] == digests[1] else "DIFFERENT", flush=True)
