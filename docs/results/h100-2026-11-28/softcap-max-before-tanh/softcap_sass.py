"""Compile-only (sm_90): the variants' kernel with the softcap (and with the window), at
the launch the package takes, the package's against the copy before the row max was
taken on the raw scores (step9_before.py): registers, stack and instruction counts.

    python softcap_sass.py > softcap-sass-tileiras-13.5.txt
"""
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import step9_before  # noqa: E402
from cutile_fmha.platforms import entry_for  # noqa: E402
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass  # noqa: E402
from cutile_fmha.steps.family import FORWARD_VARIANTS  # noqa: E402
from cutile_fmha.steps.launcher import with_hints  # noqa: E402
from cutile_fmha.steps.definitions import QUERY_TILE_STEP, STEPS  # noqa: E402
from cutile_fmha.steps.variants import Variants, variants_kernel  # noqa: E402

KEYS = ("HGMMA", "WARPGROUP.DEPBAR", "MUFU.TANH", "MUFU.EX2", "FMNMX", "SHFL", "FSEL",
        "LDL", "STL")
print(subprocess.run(["tileiras", "--version"], capture_output=True, text=True).stdout.strip())
for head_dim in (64, 128, 256):
    for causal in (True, False):
        for variants in (Variants(softcap=30.0), Variants(softcap=30.0, window=(1024, 0))):
            kernel, constants = variants_kernel(entry_for("sm_90"), head_dim=head_dim,
                                                causal=causal, query_group=1, write_lse=False,
                                                variants=variants)
            hints = STEPS[QUERY_TILE_STEP].launch_config(entry_for("sm_90"), native=True,
                                                         head_dim=head_dim, causal=causal)[1]
            for name, k in (("package", kernel),
                            ("before", with_hints(step9_before.variants_fmha, hints))):
                cubin = export_cubin(k, FORWARD_VARIANTS, dtype="bfloat16",
                                     constants=constants, arch="sm_90")
                code = sass(cubin)
                counts = {key: len(re.findall(r"\b" + re.escape(key) + r"\b", code))
                          for key in KEYS}
                print(f"D={head_dim} causal={causal} {variants} {name}:",
                      resource_usage(cubin).split(" CONST")[0], counts, flush=True)
