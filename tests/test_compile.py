"""Every step compiles, without a GPU, for every architecture in the platform tables.

Each case exports a cubin with the architecture's own table entry (tile sizes and
occupancy), as the launcher would launch it there. Hopper (sm_90), the architecture we
measure on, gets the full grid; the others get three cases per step that together cover
every head dim, both dtypes and causal and not.
"""

import pytest

from cutile_fmha.platforms import DEFAULT, HEAD_DIMS, PLATFORMS, entry_for
from cutile_fmha.platforms.environment import find_compiler
from cutile_fmha.steps import STEPS
from cutile_fmha.steps.compile import compile_step

FULL_GRID_ARCH = "sm_90"
# An architecture without a table entry, to compile the default entry.
DEFAULT_ENTRY_ARCH = "sm_86"
COVERING_CASES = [(64, "float16", True), (128, "bfloat16", False), (256, "bfloat16", True)]


def _cases():
    for arch in sorted(PLATFORMS) + [DEFAULT_ENTRY_ARCH]:
        for step in sorted(STEPS):
            if arch == FULL_GRID_ARCH:
                combos = [(d, t, c) for d in HEAD_DIMS for t in ("float16", "bfloat16")
                          for c in (False, True)]
            else:
                combos = COVERING_CASES
            for head_dim, dtype, causal in combos:
                yield pytest.param(arch, step, head_dim, dtype, causal,
                                   id=f"{arch}-step{step}-d{head_dim}-{dtype}-"
                                      f"{'causal' if causal else 'full'}")


pytestmark = pytest.mark.skipif(find_compiler().path is None, reason="tileiras is not installed")


def test_default_entry_arch_has_no_entry_of_its_own():
    assert entry_for(DEFAULT_ENTRY_ARCH) is DEFAULT


@pytest.mark.parametrize("arch,step,head_dim,dtype,causal", list(_cases()))
def test_step_compiles(arch, step, head_dim, dtype, causal):
    cubin = compile_step(step, arch, dtype=dtype, head_dim=head_dim, causal=causal)
    assert cubin[:4] == b"\x7fELF", "export_kernel did not produce a cubin"
