"""Compile-only: the decode kernel of the package beside a patched copy of kernels/decode.py
(one of the diffs here applied to a copy), sm_90, the table's D=128 launch, bf16, one new
token of 32/8 heads, no split. Prints each kernel's registers, stack and shared memory,
and, in the producer warp (after USETMAXREG.DEALLOC), where the read of the sequence's
length (the LDG), its first use and the first TMA load stand.

    python first_tile_sass.py /path/to/patched/decode.py
"""

import importlib.util
import re
import sys
from pathlib import Path

from cutile_fmha.kernels import decode as committed
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.compile import export_cubin, resource_usage, sass
from cutile_fmha.steps.decode import DecodeShape, decode_plan
from cutile_fmha.steps.family import DECODE
from cutile_fmha.steps.launcher import with_hints


def patched_module(path: str):
    source = Path(path).read_text().replace("from .", "from cutile_fmha.kernels.")
    copy = Path("/tmp/patched_decode.py")
    copy.write_text(source)
    spec = importlib.util.spec_from_file_location("patched_decode", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def producer_prologue(code: str) -> list[str]:
    lines = [line.split(";")[0].strip() for line in code.splitlines()
             if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]
    producer = next(i for i, line in enumerate(lines) if "USETMAXREG.DEALLOC" in line)
    first_read = next(i for i in range(producer, len(lines)) if "LDG" in lines[i])
    first_tma = next(i for i in range(producer, len(lines)) if "UTMALDG" in lines[i])
    return lines[first_read:first_tma + 1]


shape = DecodeShape(batch=16, head_dim=128, kv_heads=8, group=4, q_len=1, capacity=8192,
                    block_size=None, causal=False, has_starts=False, has_lengths=True,
                    write_lse=False, num_splits=1)
launch = entry_for("sm_90").decode[128]
plan = decode_plan(shape, launch, sms=132, device=None)
for name, module in (("committed", committed), ("patched", patched_module(sys.argv[1]))):
    cubin = export_cubin(with_hints(module.decode, launch.hints()), DECODE, dtype="bfloat16",
                         constants=plan.constants, arch="sm_90")
    code = sass(cubin)
    print(f"{name}: {resource_usage(cubin)}; UTMALDG {code.count('UTMALDG')}, "
          f"producer warp {'yes' if 'USETMAXREG.DEALLOC' in code else 'no'}")
    if "USETMAXREG.DEALLOC" in code:
        prologue = producer_prologue(code)
        length = re.search(r"LDG\S* (R\d+),", prologue[0]).group(1)
        use = next(i for i, line in enumerate(prologue[1:], 1)
                   if re.search(rf"[ ,]{length}\b", line.split(" ", 1)[1].split(",", 1)[-1]))
        print(f"  producer warp: the length's LDG ({prologue[0]}), its first use "
              f"{use} instructions later ({prologue[use]}), the first UTMALDG "
              f"{len(prologue) - 1} after the LDG")
