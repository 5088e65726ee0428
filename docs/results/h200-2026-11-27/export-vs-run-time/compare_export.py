"""The compile-only export (steps/compile.py) against the cubins a run compiled
(run_time_cubins.py's DIR): resource usage and the opcodes whose counts differ, per kernel.
Compiles with the tileiras on PATH (give it the run's release), or with --pip-tileiras the
pip package's. Run: PATH=<the run's tileiras>:$PATH python compare_export.py DIR"""

import collections
import re
import sys

import cuda.tile._compile as tile_compile

from cutile_fmha.steps import compile as C

if "--pip-tileiras" not in sys.argv:  # the tileiras on PATH, not the pip package's
    tile_compile._find_pip_tileiras = lambda: None

EXPORTS = {  # the run's cubin -> the same kernel from the export
    "00": lambda: C.compile_backward("dq", "sm_90", dtype="bfloat16", head_dim=128,
                                     causal=True, query_group=4),
    "01": lambda: C.compile_backward("dkdv", "sm_90", dtype="bfloat16", head_dim=128,
                                     causal=True, query_group=4),
    "03": lambda: C.compile_step(9, "sm_90", dtype="bfloat16", head_dim=128, causal=True,
                                 write_lse=True, query_group=4),
    "04": lambda: C.compile_backward("dkdv_dq", "sm_90", dtype="bfloat16", head_dim=256,
                                     causal=True),
    "06": lambda: C.compile_step(9, "sm_90", dtype="bfloat16", head_dim=256, causal=True,
                                 write_lse=True),
}


def opcodes(code):
    return collections.Counter(re.findall(
        r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", code))


def usage(cubin):
    return re.search(r"REG:\d+ STACK:\d+ SHARED:\d+", C.resource_usage(cubin))[0]


for name, export in EXPORTS.items():
    run = open(f"{sys.argv[1]}/{name}.cubin", "rb").read()
    made = export()
    ran, exported = opcodes(C.sass(run)), opcodes(C.sass(made))
    differ = {op: (ran[op], exported[op]) for op in sorted(set(ran) | set(exported))
              if ran[op] != exported[op]}
    stores = {op: n for op, n in ran.items() if op.startswith(("UTMASTG", "UTMAREDG", "STG"))}
    print(f"{name}: run {usage(run)}, export {usage(made)}; {sum(ran.values())} instructions, "
          f"stores and reductions in the run's {stores}; opcodes whose counts differ (run, "
          f"export): {differ or 'none'}")
