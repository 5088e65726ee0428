"""Compile-only (sm_90): step 9's kernel against persistent_order.py's persistent one at
step 9's launches, bf16; registers, shared memory and the synchronisation between the
producer warp and the consumer warpgroups (named barriers: BAR.SYNC waits, BAR.ARV
arrives without waiting). `python persistent_sass.py 13.4` uses the compiler in
/tmp/tc134 (the GPU bundle's) instead of the pip one."""
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
if len(sys.argv) > 1 and sys.argv[1] == "13.4":
    import os
    import cuda.tile._compile as compile_module
    os.environ["PATH"] = "/tmp/tc134/nvidia/cu13/bin:" + os.environ["PATH"]
    compile_module._find_pip_tileiras = lambda: None

from persistent_order import persistent  # noqa: E402
from cutile_fmha.platforms import entry_for  # noqa: E402
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass  # noqa: E402
from cutile_fmha.steps.definitions import STEPS  # noqa: E402
from cutile_fmha.steps.family import ROWS_MULTIPLE, forward_constants  # noqa: E402
from cutile_fmha.steps.launcher import kernel_for  # noqa: E402

COUNTED = ("HGMMA", "WARPGROUP.DEPBAR", "UTMALDG", "UTMASTG", "BAR.SYNC", "BAR.ARV",
           "SYNCS.PHASECHK", "SYNCS.ARRIVE")
for head_dim, causal in ((128, True), (128, False), (64, True), (256, True)):
    tiles, hints = STEPS[9].launch_config(entry_for("sm_90"), native=True, head_dim=head_dim,
                                          causal=causal)
    given = {k: v for k, v in hints.items() if v is not None}
    constants = forward_constants(head_dim, tiles, causal=causal, write_lse=False)
    for name, kernel in (("step 9", kernel_for(9, hints)),
                         ("persistent", persistent.replace_hints(**given))):
        cubin = export_cubin(kernel, STEPS[9].family, dtype="bfloat16", constants=constants,
                             arch="sm_90", rows_multiple=ROWS_MULTIPLE)
        code = sass(cubin)
        barriers = sorted(set(re.findall(r"BAR\.(?:SYNC\.DEFER_BLOCKING|ARV) 0x[0-9a-f]+"
                                         r"(?:, 0x[0-9a-f]+)?", code)))
        print(f"D={head_dim} {'causal' if causal else 'non-causal'} {name}: "
              f"{resource_usage(cubin).split(' CONSTANT')[0]}; "
              + ", ".join(f"{c} {len(re.findall(re.escape(c), code))}" for c in COUNTED)
              + f"; named barriers {barriers}")
