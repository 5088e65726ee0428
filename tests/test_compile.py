"""Every step compiles, without a GPU, for every architecture in the platform tables.

Each case exports a cubin with the architecture's own table entry (tile sizes, hints and
tuned launches), as the launcher would launch it there. Hopper (sm_90), the architecture
we measure on, gets every step over the full grid of head dims, dtypes and causal or not,
and the covering cases' grouped-query and log-sum-exp variants. The others get every step
once, at one of three covering cases in turn, which together cover every head dim, both
dtypes, causal and not, grouped-query heads and the log-sum-exp variant; past D=256 they
get step 10 or step 11 in turn, at one of three head dims (sm_90: both, at all three). The backward's
kernels compile at their launches for every head dim on sm_90 and one head dim elsewhere.
"""

import pytest

from cutile_fmha.kernels import backward as backward_kernels
from cutile_fmha.platforms import DEFAULT, HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS, entry_for
from cutile_fmha.platforms.environment import Compiler, find_compiler
from cutile_fmha.steps import STEPS
from cutile_fmha.steps import compile as compile_module
from cutile_fmha.steps.backward import ROW_DOT_TILE_M
from cutile_fmha.steps.compile import compile_backward, compile_step, export_cubin
from cutile_fmha.steps.compile import main as compile_main
from cutile_fmha.steps.family import ROW_DOT

FULL_GRID_ARCH = "sm_90"
# An architecture without a table entry, to compile the default entry.
DEFAULT_ENTRY_ARCH = "sm_86"
# (head dim, dtype, causal, write_lse, query heads per K/V head)
COVERING_CASES = [(64, "float16", True, False, 1), (128, "bfloat16", False, True, 4),
                  (256, "bfloat16", True, True, 8)]
FULL_GRID = [(d, t, c, False, 1) for d in HEAD_DIMS for t in ("float16", "bfloat16")
             for c in (False, True)]
# Steps 10-11 (head dim tiled): one output slice per query tile, two, and two with the
# query tile's chunks in two widths (384 = 256 + 128). sm_90 compiles every head dim at
# its tuned launches in test_machine_code.py.
LARGE_COVERING_CASES = [(320, "float16", True, False, 1), (768, "bfloat16", False, True, 4),
                        (1024, "bfloat16", True, True, 8)]


def _cases():
    for arch_index, arch in enumerate(sorted(PLATFORMS) + [DEFAULT_ENTRY_ARCH]):
        for step in sorted(STEPS):
            large = STEPS[step].head_dims == LARGE_HEAD_DIMS
            covering = LARGE_COVERING_CASES if large else COVERING_CASES
            combos = [covering[(step + arch_index) % len(covering)]]
            if arch == FULL_GRID_ARCH:
                combos = covering if large else \
                    FULL_GRID + [case for case in COVERING_CASES if case[3]]
            elif large and step % 2 != arch_index % 2:
                continue  # one of steps 10 and 11 per architecture, in turn
            for head_dim, dtype, causal, write_lse, group in combos:
                yield pytest.param(arch, step, head_dim, dtype, causal, write_lse, group,
                                   id=f"{arch}-step{step}-d{head_dim}-{dtype}-"
                                      f"{'causal' if causal else 'full'}-group{group}"
                                      f"{'-lse' if write_lse else ''}")


pytestmark = pytest.mark.skipif(find_compiler().path is None, reason="tileiras is not installed")


def test_default_entry_arch_has_no_entry_of_its_own():
    assert entry_for(DEFAULT_ENTRY_ARCH) is DEFAULT


@pytest.mark.parametrize("arch,step,head_dim,dtype,causal,write_lse,group", list(_cases()))
def test_step_compiles(arch, step, head_dim, dtype, causal, write_lse, group):
    cubin = compile_step(step, arch, dtype=dtype, head_dim=head_dim, causal=causal,
                         write_lse=write_lse, query_group=group)
    assert cubin[:4] == b"\x7fELF", "export_kernel did not produce a cubin"


@pytest.mark.parametrize("argv,message", [
    (["--arch", "sm_100a"], "expected an architecture name such as sm_90 or sm_100, got 'sm_100a'"),
    (["--arch", "sm_90x"], "expected an architecture name"),
])
def test_compile_command_refuses_misspelled_architectures(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        compile_main(argv)
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_compile_command_names_architectures_it_cannot_build(capsys, monkeypatch):
    monkeypatch.setattr(compile_module, "find_compiler", lambda: Compiler(
        "/site/nvidia/cu13/bin/tileiras", True, (13, 2), ("sm_80", "sm_100")))
    assert compile_main(["--arch", "sm_75", "--arch", "sm_90", "--steps", "1"]) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed == [
        "sm_75: cuTile compiles for compute capability 8.0 (sm_80) and newer, not sm_75.",
        "sm_90: tileiras 13.2 (pip package: /site/nvidia/cu13/bin/tileiras) cannot build for "
        "sm_90: it builds for sm_80, sm_100. Fix: pip install -U 'nvidia-cuda-tileiras>=13.4' "
        "'nvidia-cuda-nvcc>=13.4' 'nvidia-nvvm>=13.4'"]


def test_compile_command_writes_cubins_for_the_disassembler(tmp_path, capsys):
    assert compile_main(["--arch", "sm_90", "--steps", "9", "--head-dim", "64",
                         "--output-dir", str(tmp_path)]) == 0
    cubin = (tmp_path / "sm_90-float16-d64-step9-causal-group1.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF"



def _backward_cases():
    archs = sorted(PLATFORMS) + [DEFAULT_ENTRY_ARCH]
    for arch_index, arch in enumerate(archs):
        # Every head dim on sm_90; one per other architecture, in turn.
        head_dims = HEAD_DIMS if arch == FULL_GRID_ARCH else \
            [HEAD_DIMS[arch_index % len(HEAD_DIMS)]]
        for head_dim in head_dims:
            for name in ("dkdv", "dq"):
                yield pytest.param(arch, name, head_dim, id=f"{arch}-{name}-d{head_dim}")


@pytest.mark.parametrize("arch,name,head_dim", list(_backward_cases()))
def test_backward_kernel_compiles(arch, name, head_dim):
    cubin = compile_backward(name, arch, dtype="bfloat16", head_dim=head_dim, causal=True,
                             query_group=2)
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("arch", sorted(PLATFORMS) + [DEFAULT_ENTRY_ARCH])
def test_row_dot_compiles(arch):
    cubin = export_cubin(backward_kernels.row_dot, ROW_DOT, dtype="float16",
                         constants={"TILE_M": ROW_DOT_TILE_M, "TILE_D": 128}, arch=arch)
    assert cubin[:4] == b"\x7fELF"
