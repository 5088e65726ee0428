"""kernels/variants.py's kernel on step 9's loop as committed (f443a81), for softcap_ab.py's
A/B in one process with max-before-tanh.diff applied to the package. It is written at
import from the package's own kernels/step9_unmasked_loop.py, with that diff's hunk taken
back out where present and the imports made absolute, to _step9_before_generated.py beside
this file (cuTile compiles a kernel from its source file), with kernels/variants.py's
kernel after it; the A/B of 2026-11-28 ran on such a copy."""
import importlib.util
import inspect
from pathlib import Path

from cutile_fmha.kernels import step9_unmasked_loop, variants

HERE = Path(__file__).parent


def hunks(diff: str) -> list[tuple[str, str]]:
    """(the lines before, the lines after) of each of the diff's hunks."""
    sides = []
    for hunk in diff.split("\n@@")[1:]:
        before, after = [], []
        for line in hunk.split("\n", 1)[1].splitlines():
            if not line.startswith("+"):
                before.append(line[1:])
            if not line.startswith("-"):
                after.append(line[1:])
        sides.append(("\n".join(before), "\n".join(after)))
    return sides


source = inspect.getsource(step9_unmasked_loop)
for before, after in hunks((HERE / "max-before-tanh.diff").read_text()):
    source = source.replace(after, before)
source = source.replace("from ..platforms import", "from cutile_fmha.platforms import") \
    .replace("from .common import", "from cutile_fmha.kernels.common import")
generated = HERE / "_step9_before_generated.py"
# kernels/variants.py's kernel after the loop's copy (its names are the copy's; it replaces
# step 9's own ``fmha``)
kernel = inspect.getsource(variants).split("import attend_query_tile\n", 1)[1]
generated.write_text(source + kernel)
spec = importlib.util.spec_from_file_location("_step9_before_generated", generated)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
variants_fmha = module.fmha
