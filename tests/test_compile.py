"""Every kernel compiles, without a GPU, for every architecture in the platform tables.

Each case exports a cubin with the architecture's own table entry (tile sizes, hints and
tuned launches), as the launcher would launch it there. Compiles cost seconds each on a CI
core, so the cases are sampled, not crossed. Hopper (sm_90), the architecture we measure
on, gets every step at every head dim it runs (past D=256 at three of them), with dtype,
causal or not, grouped-query heads and the log-sum-exp variant rotating across them.
Every other architecture gets the step ``attention()`` runs there and, in turn, more
steps (so each step meets some other architecture too), at a variant in turn, and past
D=256 step 10 or 11 in turn at D=320. The backward's kernels compile at their launches
for every head dim on sm_90 and one kernel at one head dim elsewhere; the variable-length
kernels (kernels/varlen.py) likewise, and the decode kernels (kernels/decode.py) at every
head dim on sm_90 and one variant in turn elsewhere; the padding-runs kernel
(kernels/padding.py) on every mask dtype on sm_90 and one in turn elsewhere.
"""

import pytest

from cutile_fmha.kernels import backward as backward_kernels
from cutile_fmha.platforms import DEFAULT, HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS, entry_for
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.platforms.environment import Compiler, find_compiler
from cutile_fmha.steps import compile as compile_module
from cutile_fmha.steps.backward import row_dot_tile_m
from cutile_fmha.steps.compile import (compile_backward, compile_decode, compile_padding_runs,
                                       compile_step, compile_variants, compile_varlen,
                                       export_cubin)
from cutile_fmha.steps.variants import Variants
from cutile_fmha.steps.compile import main as compile_main
from cutile_fmha.steps.definitions import fastest_step, steps_for
from cutile_fmha.steps.family import ROW_DOT

FULL_GRID_ARCH = "sm_90"
# An architecture without a table entry, to compile the default entry.
DEFAULT_ENTRY_ARCH = "sm_86"
OTHER_ARCHS = sorted(set(PLATFORMS) - {FULL_GRID_ARCH}) + [DEFAULT_ENTRY_ARCH]
# (dtype, causal, write_lse, query heads per K/V head), rotated through the cases.
VARIANTS = [("float16", True, False, 1), ("bfloat16", False, True, 4),
            ("bfloat16", True, True, 8), ("float16", False, False, 2)]
SMALL_STEPS = steps_for(HEAD_DIMS[0])
LARGE_STEPS = steps_for(LARGE_HEAD_DIMS[0])
# Steps 10-11 (head dim tiled) on sm_90: one output slice per query tile, two, and two with
# the query tile's chunks in two widths (384 = 256 + 128); every head dim's tuned launch
# compiles in test_machine_code.py. Elsewhere the smallest.
LARGE_SAMPLE = (320, 768, 1024)


def _param(arch, step, head_dim, variant):
    dtype, causal, write_lse, group = variant
    return pytest.param(arch, step, head_dim, dtype, causal, write_lse, group,
                        id=f"{arch}-step{step}-d{head_dim}-{dtype}-"
                           f"{'causal' if causal else 'full'}-group{group}"
                           f"{'-lse' if write_lse else ''}")


def _cases():
    count = 0
    for steps, head_dims in ((SMALL_STEPS, HEAD_DIMS), (LARGE_STEPS, LARGE_SAMPLE)):
        for step in steps:
            for head_dim in head_dims:
                yield _param(FULL_GRID_ARCH, step, head_dim, VARIANTS[count % len(VARIANTS)])
                count += 1
    for index, arch in enumerate(OTHER_ARCHS):
        variant = VARIANTS[index % len(VARIANTS)]
        head_dim = HEAD_DIMS[index % len(HEAD_DIMS)]
        runs = fastest_step(entry_for(arch), head_dim, variant[1])
        for step in sorted({runs, *SMALL_STEPS[index::len(OTHER_ARCHS)]}):
            yield _param(arch, step, head_dim, variant)
        yield _param(arch, LARGE_STEPS[index % len(LARGE_STEPS)], LARGE_SAMPLE[0], variant)


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



BACKWARD_LAUNCHES = ("dkdv", "dq", "dkdv_dq")  # "dkdv_dq": dK/dV with ATOMIC_DQ
# Every launch of every head dim on sm_90 ("dkdv_dq" where the table has one); one
# elsewhere, in turn.
BACKWARD_CASES = [(name, head_dim) for head_dim, launches in
                  sorted(backward_entry_for(FULL_GRID_ARCH).launches.items())
                  for name in BACKWARD_LAUNCHES if name in launches]


def _backward_cases():
    for name, head_dim in BACKWARD_CASES:
        yield pytest.param(FULL_GRID_ARCH, name, head_dim, id=f"sm_90-{name}-d{head_dim}")
    for index, arch in enumerate(OTHER_ARCHS):
        name, head_dim = BACKWARD_CASES[index * 2 % len(BACKWARD_CASES)]
        yield pytest.param(arch, name, head_dim, id=f"{arch}-{name}-d{head_dim}")


@pytest.mark.parametrize("arch,name,head_dim", list(_backward_cases()))
def test_backward_kernel_compiles(arch, name, head_dim):
    cubin = compile_backward(name, arch, dtype="bfloat16", head_dim=head_dim, causal=True,
                             query_group=2)
    assert cubin[:4] == b"\x7fELF"


# row_dot at each tile width on sm_90, at D=128 elsewhere.
@pytest.mark.parametrize("arch,tile_d", [(FULL_GRID_ARCH, d) for d in (64, 128, 256)]
                         + [(arch, 128) for arch in sorted(PLATFORMS) + [DEFAULT_ENTRY_ARCH]
                            if arch != FULL_GRID_ARCH])
def test_row_dot_compiles(arch, tile_d):
    cubin = export_cubin(backward_kernels.row_dot, ROW_DOT, dtype="float16",
                         constants={"TILE_M": row_dot_tile_m(tile_d), "TILE_D": tile_d},
                         arch=arch)
    assert cubin[:4] == b"\x7fELF"


def _varlen_cases():
    # sm_90: the forward at every head dim and each backward launch; elsewhere one kernel.
    named = [("fmha", head_dim) for head_dim in HEAD_DIMS] + BACKWARD_CASES
    cases = [(FULL_GRID_ARCH, "fmha", head_dim, VARIANTS[i])
             for i, head_dim in enumerate(HEAD_DIMS)]
    cases += [(FULL_GRID_ARCH, name, 128, VARIANTS[2]) for name in ("dkdv", "dq")]
    cases += [(FULL_GRID_ARCH, "dkdv_dq", 64, VARIANTS[2])]
    cases += [(arch, *named[index * 3 % len(named)], VARIANTS[index % len(VARIANTS)])
              for index, arch in enumerate(OTHER_ARCHS)]
    for arch, name, head_dim, (dtype, causal, write_lse, group) in cases:
        yield pytest.param(arch, name, head_dim, dtype, causal, write_lse and name == "fmha",
                           group, id=f"{arch}-{name}-d{head_dim}-{dtype}-"
                                     f"{'causal' if causal else 'full'}-group{group}")


@pytest.mark.parametrize("arch,name,head_dim,dtype,causal,write_lse,group", list(_varlen_cases()))
def test_varlen_kernel_compiles(arch, name, head_dim, dtype, causal, write_lse, group):
    cubin = compile_varlen(name, arch, dtype=dtype, head_dim=head_dim, causal=causal,
                           write_lse=write_lse, query_group=group)
    assert cubin[:4] == b"\x7fELF"


# The decode kernel and its merge: one variant per architecture, in turn (dense or paged,
# split or not, causal rows, left padding, LSE, 64 columns on the products' M side),
# every head dim of the tables and two on padded tiles on sm_90.
DECODE_VARIANTS = [dict(block_size=None, splits=1, q_len=1),
                   dict(block_size=None, splits=4, q_len=16, causal=True, has_starts=True),
                   dict(block_size=16, splits=4, q_len=4, causal=True, write_lse=True),
                   dict(block_size=None, splits=8, q_len=2, has_starts=True, causal=True),
                   dict(block_size=256, splits=1, q_len=1, write_lse=True),
                   # paged, on the M side, 4 or 8 blocks a tile
                   dict(block_size=16, splits=2, q_len=16, causal=True),
                   dict(block_size=64, splits=4, q_len=2, causal=True,
                        variants=Variants(window=(256, 0), softcap=30.0, sinks=True))]


def _decode_cases():
    for index, head_dim in enumerate(HEAD_DIMS):
        yield FULL_GRID_ARCH, head_dim, DECODE_VARIANTS[index % len(DECODE_VARIANTS)]
    yield FULL_GRID_ARCH, 128, DECODE_VARIANTS[-1]
    # padded tiles: 96 on 128 columns; 192/128, Q and K on 256, V on 128
    yield FULL_GRID_ARCH, 96, DECODE_VARIANTS[2]
    yield FULL_GRID_ARCH, 192, DECODE_VARIANTS[5] | {"value_head_dim": 128}
    # K in two loads (D_TAIL): 80 on 64 + 16 columns, paged in blocks of 64, and dense on
    # another architecture
    yield FULL_GRID_ARCH, 80, dict(block_size=64, splits=3)
    yield OTHER_ARCHS[0], 80, {}
    # a chunk of 300 new tokens: CTAs of 128 columns (COLUMN_TILES)
    yield FULL_GRID_ARCH, 128, dict(block_size=64, splits=2, q_len=300, causal=True)
    for index, arch in enumerate(OTHER_ARCHS):
        yield arch, 128, DECODE_VARIANTS[index % len(DECODE_VARIANTS)]


@pytest.mark.parametrize("arch,head_dim,variant", list(_decode_cases()))
def test_decode_kernels_compile(arch, head_dim, variant):
    for cubin in compile_decode(arch, dtype="bfloat16", head_dim=head_dim, **variant):
        assert cubin[:4] == b"\x7fELF", "export_kernel did not produce a cubin"


# The variants' kernel: each variant alone and combined on sm_90 at every head dim, and one
# combination in turn on each other architecture.
VARIANT_CASES = [Variants(window=(128, None)), Variants(softcap=30.0), Variants(sinks=True),
                 Variants(window=(64, 16), softcap=50.0, sinks=True)]


def _variant_cases():
    for index, head_dim in enumerate(HEAD_DIMS * 2):
        yield FULL_GRID_ARCH, head_dim, VARIANT_CASES[index % len(VARIANT_CASES)], VARIANTS[index % 4]
    for index, arch in enumerate(OTHER_ARCHS):
        yield arch, 128, VARIANT_CASES[index % len(VARIANT_CASES)], VARIANTS[index % 4]


@pytest.mark.parametrize("arch,head_dim,variants,variant", list(_variant_cases()))
def test_variants_kernel_compiles(arch, head_dim, variants, variant):
    dtype, causal, write_lse, group = variant
    cubin = compile_variants(arch, dtype=dtype, head_dim=head_dim, causal=causal,
                             variants=variants, write_lse=write_lse, query_group=group)
    assert cubin[:4] == b"\x7fELF"


# The variable-length forward with the variants: each alone on sm_90, all of them on one
# other architecture.
@pytest.mark.parametrize("arch,variants,variant",
                         [(FULL_GRID_ARCH, v, VARIANTS[i]) for i, v in enumerate(VARIANT_CASES)]
                         + [(OTHER_ARCHS[0], VARIANT_CASES[-1], VARIANTS[1])])
def test_variable_length_forward_compiles_with_the_variants(arch, variants, variant):
    dtype, causal, write_lse, group = variant
    cubin = compile_varlen("fmha", arch, dtype=dtype, head_dim=128, causal=causal,
                           write_lse=write_lse, query_group=group, variants=variants)
    assert cubin[:4] == b"\x7fELF"


# The backward with the softcap and the window (the sinks need no constant there): dK/dV and
# dQ, dense and variable-length, with each variant in turn on sm_90, one on each other
# architecture.
def _backward_variant_cases():
    backward_variants = VARIANT_CASES[:2] + VARIANT_CASES[3:]
    pairs = [(n, v) for v in (False, True) for n in ("dkdv", "dq")]
    for index, (name, varlen) in enumerate(pairs):
        yield (FULL_GRID_ARCH, name, varlen, HEAD_DIMS[index % len(HEAD_DIMS)],
               backward_variants[index % len(backward_variants)], index % 2 == 0)
    for index, (varlen, head_dim) in enumerate([(False, 64), (True, 256)]):
        yield (FULL_GRID_ARCH, "dkdv_dq", varlen, head_dim,
               backward_variants[index % len(backward_variants)], index % 2 == 0)
    for index, arch in enumerate(OTHER_ARCHS):
        yield (arch, ("dkdv", "dq")[index % 2], index % 2 == 1, 128,
               backward_variants[index % len(backward_variants)], True)


@pytest.mark.parametrize("arch,name,varlen,head_dim,variants,causal",
                         list(_backward_variant_cases()))
def test_backward_kernels_compile_with_the_variants(arch, name, varlen, head_dim, variants,
                                                    causal):
    compile_one = compile_varlen if varlen else compile_backward
    cubin = compile_one(name, arch, dtype="bfloat16", head_dim=head_dim, causal=causal,
                        query_group=2, variants=variants)
    assert cubin[:4] == b"\x7fELF"


# V's tile narrower than Q's and K's (D_qk=192 padded to 256, D_v=128): on sm_90, the
# variants' forward, the variable-length forward and both backward kernels.
@pytest.mark.parametrize("kernel", ["variants", "varlen fmha", "dkdv", "varlen dq"])
def test_value_tiles_narrower_than_query_tiles_compile(kernel):
    options = dict(dtype="bfloat16", head_dim=256, value_head_dim=128, causal=True,
                   query_group=2)
    if kernel == "variants":
        cubin = compile_variants(FULL_GRID_ARCH, variants=Variants(), **options)
    elif kernel.startswith("varlen"):
        cubin = compile_varlen(kernel.split()[1], FULL_GRID_ARCH, **options)
    else:
        cubin = compile_backward(kernel, FULL_GRID_ARCH, **options)
    assert cubin[:4] == b"\x7fELF"


# The padding-runs kernel on the masks transformers and users pass: every dtype on sm_90,
# one in turn elsewhere.
@pytest.mark.parametrize("arch,mask_dtype",
                         [(FULL_GRID_ARCH, dtype) for dtype in ("bool", "int32", "int64")]
                         + [(arch, ("int64", "bool")[index % 2])
                            for index, arch in enumerate(OTHER_ARCHS)])
def test_padding_runs_compile(arch, mask_dtype):
    assert compile_padding_runs(arch, mask_dtype=mask_dtype)[:4] == b"\x7fELF"
