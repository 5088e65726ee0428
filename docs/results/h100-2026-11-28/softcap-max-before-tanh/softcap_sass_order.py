"""Compile-only (sm_90): the order of the multi-function, max and shuffle instructions after
the first wait for Q K^T in the softcap's unmasked loop, D=128 without the mask, in the
package with max-before-tanh.diff applied and in the committed loop (step9_before.py):
runs of one instruction, "NAME xCOUNT", in program order.

    git apply max-before-tanh.diff  # in the repository; then, in this folder:
    python softcap_sass_order.py > softcap-sass-order-tileiras-13.5.txt
"""
import re
import sys
from itertools import groupby
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import step9_before  # noqa: E402
from cutile_fmha.platforms import entry_for  # noqa: E402
from cutile_fmha.steps.compile import export_cubin, sass  # noqa: E402
from cutile_fmha.steps.definitions import QUERY_TILE_STEP, STEPS  # noqa: E402
from cutile_fmha.steps.family import FORWARD_VARIANTS  # noqa: E402
from cutile_fmha.steps.launcher import with_hints  # noqa: E402
from cutile_fmha.steps.variants import Variants, variants_kernel  # noqa: E402

PATTERN = re.compile(r"(HGMMA\S*|WARPGROUP\.DEPBAR\S*|MUFU\.[A-Z0-9]+|FMNMX|SHFL\.[A-Z]+|"
                     r"F2FP\S*)")
entry = entry_for("sm_90")
kernel, constants = variants_kernel(entry, head_dim=128, causal=False, query_group=1,
                                    write_lse=False, variants=Variants(softcap=30.0))
hints = STEPS[QUERY_TILE_STEP].launch_config(entry, native=True, head_dim=128, causal=False)[1]
for name, k in (("raw max (the diff applied)", kernel),
                ("committed", with_hints(step9_before.variants_fmha, hints))):
    code = sass(export_cubin(k, FORWARD_VARIANTS, dtype="bfloat16", constants=constants,
                             arch="sm_90"))
    names = PATTERN.findall(code)
    first_wait = names.index(next(n for n in names if n.startswith("WARPGROUP.DEPBAR")),
                             names.index(next(n for n in names if n.startswith("HGMMA"))))
    runs = [f"{n} x{len(list(group))}" for n, group in groupby(names[first_wait:first_wait + 400])]
    print(f"{name}: {'; '.join(runs[:120])}\n", flush=True)
