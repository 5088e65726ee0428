"""What the compiler makes of the kernels on Hopper, read from the cubin (no GPU).

The sm_90 table entry was chosen by timing; these checks say why the final step is fast
and keep it so: warpgroup MMA (HGMMA) and TMA loads (UTMALDG), and at most a few spilled
registers. They also pin down what two ideas cost: the approximate division, and the
log-sum-exp output, which must cost nothing when it is off, as must the FP8 forward's and
the variants' branches in step 9's code when their constants are off; and that the FP8
forward multiplies on the float8 warpgroup path and the softcap is a hardware tanh.
"""

import ast
import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from cutile_fmha.kernels import backward as backward_kernels
from cutile_fmha.kernels import decode as decode_kernels
from cutile_fmha.kernels import step5_occupancy, step6_approx_div, step9_unmasked_loop
from cutile_fmha.platforms import HEAD_DIMS, LARGE_HEAD_DIMS, entry_for
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.platforms.entry import TileShape, TunedLaunch
from cutile_fmha.platforms.environment import find_compiler, find_cuda_tool
from cutile_fmha.platforms.search_space import MAX_STACK_BYTES
from cutile_fmha.steps import STEPS
from cutile_fmha.steps.backward import BACKWARD_FAMILIES, backward_kernel
from cutile_fmha.steps.compile import (compile_backward, compile_decode, compile_fp8,
                                       compile_step, compile_variants, compile_varlen,
                                       export_cubin, resource_usage, sass)
from cutile_fmha.steps.definitions import fastest_step, step_of
from cutile_fmha.steps.decode import DecodeShape, decode_plan
from cutile_fmha.steps.family import (DECODE, ROWS_MULTIPLE, backward_constants,
                                      forward_constants)
from cutile_fmha.steps.launcher import with_hints
from cutile_fmha.steps.variants import Variants

pytestmark = pytest.mark.skipif(
    find_compiler().path is None or not all(find_cuda_tool(tool)
                                            for tool in ("cuobjdump", "nvdisasm")),
    reason="needs tileiras, cuobjdump and nvdisasm (pip install -e '.[dev]')")


def assert_no_spills(usage: str, code: str) -> None:
    """No stack frame in cuobjdump's resource usage and no local loads or stores in the
    SASS."""
    assert "STACK:0 " in usage and not re.search(r"\b(STL|LDL)\b", code), usage


def assert_tuned_spills(usage: str, code: str) -> int:
    """A tuned launch's spills: the autotuner times a launch with a few spilled registers
    (platforms/search_space.py) and keeps it only where it measured faster than every
    launch without; none beyond that, and no local traffic without a stack frame. Returns
    the stack frame's bytes."""
    stack_bytes = int(re.search(r"STACK:(\d+)", usage)[1])
    assert stack_bytes <= MAX_STACK_BYTES, f"register spills: {usage}"
    if not stack_bytes:
        assert not re.search(r"\b(STL|LDL)\b", code), "local-memory traffic in the SASS"
    return stack_bytes


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", HEAD_DIMS + LARGE_HEAD_DIMS)
def test_hopper_entry_uses_warpgroup_mma_and_tma_without_spills(head_dim, causal):
    """What the drop-in runs on sm_90: the fastest step at its tuned launch."""
    step = fastest_step(entry_for("sm_90"), head_dim, causal)
    cubin = compile_step(step, "sm_90", dtype="float16", head_dim=head_dim, causal=causal)
    usage, code = resource_usage(cubin), sass(cubin)
    assert "HGMMA" in code and "UTMALDG" in code
    stack_bytes = assert_tuned_spills(usage, code)
    if head_dim in LARGE_HEAD_DIMS:  # the tuned launches past D=256 spill nothing
        assert stack_bytes == 0, f"register spills: {usage}"


def test_outputs_and_gradients_are_stored_by_tma_as_in_the_run_time_kernels():
    """The export declares the head dim a multiple of 16, as each run-time compile of these
    shapes knows it (steps/family.py's HEAD_DIM_MULTIPLE): step 9's output and the
    backward's dK, dV and dQ tiles are stored by TMA (UTMASTG), not element by element
    (STG.E.U16, what tileiras 13.5 compiles without it: docs/performance.md, "The
    compile-only export against the kernels that run")."""
    options = dict(dtype="bfloat16", head_dim=128, causal=True)
    for cubin in [compile_step(9, "sm_90", **options)] + \
            [compile_backward(name, "sm_90", **options) for name in ("dkdv", "dq")]:
        code = sass(cubin)
        assert "UTMASTG" in code and "STG.E.U16" not in code


def test_approximate_division_is_a_hardware_reciprocal():
    before, after = (sass(compile_step(step.number, "sm_90", dtype="float16", head_dim=128,
                                       causal=False))
                     for step in (step_of(step5_occupancy), step_of(step6_approx_div)))
    # IEEE division checks each quotient (FCHK) and calls a slow path; the approximate
    # one is a reciprocal (MUFU.RCP) and a multiply.
    assert "FCHK" in before and "CALL.REL" in before
    assert "MUFU.RCP" in after and "FCHK" not in after and "CALL.REL" not in after


class _DeleteBranches(ast.NodeTransformer):
    """Replaces every `if NAME:` block (or `if NAME > 0:`, for a size), for NAME a constant
    of `names`, by its `else` (or nothing): the code as if the constant were off and had
    never been written; makes relative imports absolute."""

    def __init__(self, names):
        self.names = set(names)

    def visit_If(self, node):
        test = node.test
        if isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.Gt) and \
                isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0:
            test = test.left
        if isinstance(test, ast.Name) and test.id in self.names:
            kept = []  # the else's statements, those of a nested branch deleted in turn
            for statement in node.orelse:
                visited = self.visit(statement)
                kept += visited if isinstance(visited, list) else [visited] if visited else []
            return kept or None
        return self.generic_visit(node)

    def visit_ImportFrom(self, node):
        if node.level:
            package = "cutile_fmha.kernels" if node.level == 1 else "cutile_fmha"
            node.module = package if node.module is None else f"{package}.{node.module}"
            node.level = 0
        return node


def module_without(source_file: str, folder: Path, *constants: str):
    """A copy of the kernels' module `source_file` with the code under the `constants`
    deleted (what runs when they are off kept)."""
    source = Path(source_file).read_text()
    path = folder / f"{Path(source_file).stem}_without_{'_'.join(constants).lower()}.py"
    path.write_text(ast.unparse(_DeleteBranches(constants).visit(ast.parse(source))))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel_without(step: int, folder: Path, *constants: str):
    """The step's kernel from ``module_without`` its module."""
    return module_without(STEPS[step].source_file, folder, *constants).fmha


def sm90_sass(step: int, kernel, *, write_lse: bool) -> str:
    """`kernel` (step `step`'s, or a variant of it) at D=128, or past D=256 at D=320, with
    the step's sm_90 tiles."""
    head_dim = 128 if 128 in STEPS[step].head_dims else 320
    tiles, _ = STEPS[step].launch_config(entry_for("sm_90"), native=True, head_dim=head_dim,
                                         causal=True)
    constants = forward_constants(head_dim, tiles, causal=True, write_lse=write_lse)
    return sass(export_cubin(kernel, STEPS[step].family, dtype="float16", constants=constants,
                             arch="sm_90"))


@pytest.mark.parametrize("step", sorted(STEPS))
def test_log_sum_exp_costs_nothing_when_off(step, tmp_path):
    """With WRITE_LSE=False the sm_90 machine code is, instruction for instruction, that of
    the same kernel with its log-sum-exp code deleted; with it on, the code changes."""
    off = sm90_sass(step, STEPS[step].kernel, write_lse=False)
    assert off == sm90_sass(step, kernel_without(step, tmp_path, "WRITE_LSE"), write_lse=False)
    assert off != sm90_sass(step, STEPS[step].kernel, write_lse=True)


@pytest.mark.parametrize("variant", [("FP8",), ("SOFTCAP",), ("WINDOW",), ("SINKS",),
                                     ("BLOCK_ROWS", "TILES_PER_BLOCK", "BLOCKS_PER_TILE")])
def test_variant_branches_cost_the_plain_kernel_nothing(variant, tmp_path):
    """Step 9's code serves the FP8 forward, the variants (kernels/fp8.py,
    kernels/variants.py) and the decode kernel's paged caches (BLOCK_ROWS) through
    constants: off (every step 9 launch), the machine code is that of the code without
    the variant's branches."""
    step = step_of(step9_unmasked_loop).number
    assert sm90_sass(step, STEPS[step].kernel, write_lse=False) == \
        sm90_sass(step, kernel_without(step, tmp_path, *variant), write_lse=False)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_variant_branches_cost_the_plain_decode_nothing(paged, tmp_path):
    """The decode kernel's SOFTCAP, WINDOW and SINKS off (every plain decoding launch):
    its sm_90 machine code is that of kernels/decode.py with their branches deleted, split
    and causal, dense with left padding or paged."""
    shape = DecodeShape(batch=1, head_dim=128, kv_heads=8, group=4, q_len=2, capacity=8192,
                        block_size=64 if paged else None, causal=True, has_starts=not paged,
                        has_lengths=True, write_lse=True, num_splits=4)
    launch = entry_for("sm_90").decode[128]
    plan = decode_plan(shape, launch, sms=132, device=None)
    without = module_without(decode_kernels.__file__, tmp_path, "SOFTCAP", "WINDOW", "SINKS",
                             "QUERIES_ON_M")
    assert sass(export_cubin(plan.kernel, DECODE, dtype="bfloat16", constants=plan.constants,
                             arch="sm_90")) == \
        sass(export_cubin(with_hints(without.decode, plan.hints), DECODE,
                          dtype="bfloat16", constants=plan.constants, arch="sm_90"))


@pytest.mark.parametrize("name", ["dkdv", "dq"])
def test_backward_variant_branches_cost_the_plain_backward_nothing(name, tmp_path):
    """The backward's SOFTCAP, WINDOW, ATOMIC_DQ, ADD_TO_DKDV, DQ_LATE and DELTA_FROM_OUT off
    and no TILE_D_TAIL (the plain two-kernel backward launches, Delta made by row_dot): the
    sm_90 machine code is that of kernels/backward.py with their branches deleted."""
    launch = backward_entry_for("sm_90").launches[128][name]
    constants = backward_constants(128, launch.tiles, query_group=2, causal=True)
    without = module_without(backward_kernels.__file__, tmp_path, "SOFTCAP", "WINDOW",
                             "TILE_D_TAIL", "ATOMIC_DQ", "ADD_TO_DKDV", "DQ_LATE",
                             "DELTA_FROM_OUT")
    assert sass(compile_backward(name, "sm_90", dtype="bfloat16", head_dim=128, causal=True,
                                 query_group=2, delta_from_out=False)) == \
        sass(export_cubin(backward_kernel(name, launch.num_worker_warps, without),
                          BACKWARD_FAMILIES[name], dtype="bfloat16", constants=constants,
                          arch="sm_90", rows_multiple=ROWS_MULTIPLE))


def test_softcap_is_one_hardware_tanh_per_score_and_window_and_sinks_spill_nothing():
    """The variants' kernel with everything on at D=128, causal: MUFU.TANH (no software
    tanh), warpgroup MMA and TMA loads, no spill."""
    cubin = compile_variants("sm_90", dtype="bfloat16", head_dim=128, causal=True,
                             variants=Variants(window=(256, None), softcap=30.0, sinks=True),
                             write_lse=True)
    usage, code = resource_usage(cubin), sass(cubin)
    assert "MUFU.TANH" in code and "HGMMA" in code and "UTMALDG" in code
    assert_no_spills(usage, code)


@pytest.mark.parametrize("head_dim", [d for d, launches in
                                      backward_entry_for("sm_90").launches.items()
                                      if "dkdv_dq" in launches])
def test_dq_added_in_dkdv_is_a_tma_reduction_and_spills_little(head_dim):
    """"dkdv_dq" (dK/dV with ATOMIC_DQ) on sm_90, causal, grouped: warpgroup MMA, TMA
    loads, dQ added to its float32 buffer by TMA reductions (UTMAREDG ... ADD: the head dim
    a multiple of 16, as the run-time kernels know it; not one REDG per element), no
    returning atomics, at most a few spilled registers: those launches spill 0-32 bytes
    (docs/performance.md)."""
    cubin = compile_backward("dkdv_dq", "sm_90", dtype="bfloat16", head_dim=head_dim,
                             causal=True, query_group=2)
    usage, code = resource_usage(cubin), sass(cubin)
    assert "HGMMA" in code and "UTMALDG" in code
    assert re.search(r"UTMAREDG\.\S*ADD", code) and "REDG.E.ADD" not in code
    assert "ATOMG" not in code
    assert int(re.search(r"STACK:(\d+)", usage).group(1)) <= 32, usage


def test_chunks_after_the_first_add_dk_dv_to_float32_sums_by_tma_as_they_store():
    """"dkdv_dq" at D=128 (the launch that runs long query ranges in chunks) with
    ADD_TO_DKDV, dK and dV float32, sm_90: warpgroup MMA, the sums read by TMA loads, and
    at most the few spilled registers of the "dkdv_dq" launches (0 bytes under tileiras
    13.4, 8 under 13.5)."""
    options = dict(dtype="bfloat16", head_dim=128, causal=False, query_group=1)
    writes = compile_backward("dkdv_dq", "sm_90", **options)
    adds = compile_backward("dkdv_dq", "sm_90", add_to_dkdv=True, **options)
    usage, code = resource_usage(adds), sass(adds)
    assert "HGMMA" in code and code.count("UTMALDG") > sass(writes).count("UTMALDG")
    assert int(re.search(r"STACK:(\d+)", usage)[1]) <= 32, usage


@pytest.mark.parametrize("name", ["dkdv", "dq"])
def test_backward_softcap_is_a_hardware_tanh_and_the_variants_spill_little(name):
    """dK/dV and dQ with the softcap and window at D=128, causal: warpgroup MMA, TMA loads,
    MUFU.TANH, and at most the few spilled registers the autotuner allows (the softcap's
    dK/dV spills 8-40 bytes: docs/performance.md)."""
    cubin = compile_backward(name, "sm_90", dtype="bfloat16", head_dim=128, causal=True,
                             query_group=2, variants=Variants(window=(256, None), softcap=30.0))
    usage, code = resource_usage(cubin), sass(cubin)
    assert "MUFU.TANH" in code and "HGMMA" in code and "UTMALDG" in code
    assert int(re.search(r"STACK:(\d+)", usage)[1]) <= MAX_STACK_BYTES, usage


def test_value_tiles_narrower_than_query_tiles_keep_warpgroup_mma_without_spills():
    """D_qk=192 with D_v=128 (TILE_D 256, TILE_DV 128) at D=256's launch: both products
    warpgroup MMAs on TMA loads, no spill, forward and both backward kernels."""
    options = dict(dtype="bfloat16", head_dim=256, value_head_dim=128, causal=True,
                   query_group=2)
    for cubin in (compile_variants("sm_90", variants=Variants(), **options),
                  *(compile_backward(name, "sm_90", **options) for name in ("dkdv", "dq"))):
        usage, code = resource_usage(cubin), sass(cubin)
        assert "HGMMA" in code and "UTMALDG" in code
        assert_no_spills(usage, code)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_fp8_forward_multiplies_in_float8_with_tma_loads_and_tuned_spills(head_dim, causal):
    """Both products are float8 warpgroup MMAs (QGMMA, none in 16 bits), V^T's tiles too
    are TMA loads, and the launch the table gives spills no more than a tuned launch may.
    At D=256 its 128-row tiles fit only with the products accumulated in the tensor cores
    (without, 464-528 bytes of stack: kernels/fp8.py)."""
    cubin = compile_fp8("sm_90", head_dim=head_dim, causal=causal)
    usage, code = resource_usage(cubin), sass(cubin)
    assert "QGMMA" in code and "E4M3.E4M3" in code and "HGMMA" not in code
    assert "UTMALDG" in code
    assert_tuned_spills(usage, code)


def test_fp8_launch_moves_its_share_of_exponentials_off_the_multi_function_unit():
    """A launch's fma_exp2 takes one exponential in fma_exp2 of each unmasked key tile off
    MUFU.EX2, and leaves the products and the pipeline as they were: 128x256 tiles at D=128,
    eight worker warps (two warpgroups of 64 rows), so a thread's unmasked tile has 128
    exponentials and 1 in 8 of them moves: 16 fewer, and no stack."""
    counts = {}
    for share in (0, 8):
        launch = TunedLaunch(9, TileShape(128, 256), 1, 8, fma_exp2=share)
        entry = dataclasses.replace(entry_for("sm_90"), fp8_tuned={(128, False): launch})
        cubin = compile_fp8("sm_90", head_dim=128, causal=False, entry=entry)
        usage, code = resource_usage(cubin), sass(cubin)
        assert_no_spills(usage, code)
        counts[share] = (code.count("MUFU.EX2"), code.count("QGMMA"), usage.split("SHARED:")[1])
    assert counts[0][0] - counts[8][0] == 16
    assert counts[0][1:] == counts[8][1:]


@pytest.mark.parametrize("name,causal", [("fmha", True), ("fmha", False), ("dkdv", True),
                                         ("dq", True)])
def test_variable_length_kernels_keep_warpgroup_mma_and_tma_loads_without_spills(name, causal):
    """Views of one sequence (Array.slice) are still TMA loads, from descriptors the CTA
    makes, and the varlen kernels' extra bookkeeping spills nothing at D=128."""
    cubin = compile_varlen(name, "sm_90", dtype="bfloat16", head_dim=128, causal=causal,
                           write_lse=name == "fmha", query_group=4)
    usage, code = resource_usage(cubin), sass(cubin)
    assert "HGMMA" in code and "UTMALDG" in code
    assert_no_spills(usage, code)


@pytest.mark.parametrize("head_dim,causal,write_lse", [(128, True, False), (64, False, True),
                                                      (512, True, False)])
def test_packed_tensors_viewed_in_the_kernel_keep_the_forwards_machine_code(head_dim, causal,
                                                                             write_lse):
    """A packed call without gradients passes its (tokens, heads, D) tensors as they are
    and the kernel views them as one batch row (``Array.from_foreign``): the same TMA
    loads, warpgroup products, registers and shared memory as on the host's views, and no
    spill."""
    options = dict(dtype="bfloat16", head_dim=head_dim, causal=causal, write_lse=write_lse,
                   query_group=4)
    rows, packed = (compile_varlen("fmha", "sm_90", packed_tensors=p, **options)
                    for p in (False, True))

    def profile(cubin):
        code = sass(cubin)
        return ({op: len(re.findall(op, code)) for op in ("UTMALDG", "UTMACCTL", "HGMMA")},
                re.search(r"REG:\d+", resource_usage(cubin))[0],
                re.search(r"SHARED:\d+", resource_usage(cubin))[0])

    assert profile(packed) == profile(rows)
    assert_no_spills(resource_usage(packed), sass(packed))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_variable_length_dkdv_makes_tensor_maps_only_for_the_tiles_it_loops_over(head_dim):
    """On a view the CTA writes each TMA load's and store's tensor map itself (UTMACCTL.IV
    after it): the dK/dV kernel reads its key tile once by plain loads, so it makes maps
    for Q and dO, which its loop reads, and for the dK and dV it stores, no more than dQ,
    whose loop reads K and V; the dense dK/dV loads and stores by TMA from the host's
    tensor maps (no UTMACCTL.IV, no plain loads)."""
    options = dict(dtype="bfloat16", head_dim=head_dim, causal=True, query_group=4)
    varlen = {name: sass(compile_varlen(name, "sm_90", **options)) for name in ("dkdv", "dq")}
    dense = sass(compile_backward("dkdv", "sm_90", **options))
    maps = {name: len(re.findall(r"UTMACCTL\.IV", code)) for name, code in varlen.items()}
    assert 0 < maps["dkdv"] <= maps["dq"], maps
    assert re.search(r"\bLDG\b", varlen["dkdv"]) and "UTMASTG" in varlen["dkdv"]
    assert "UTMACCTL.IV" not in dense and not re.search(r"\bLDG\b", dense)
    assert "UTMASTG" in dense


# Q and K in two column tiles (D=96: 64 + 32, D_qk=192: 128 + 64 with D_v=128): the
# variants' forward on sm_90, with fewer warpgroup products than the padded tiles.
@pytest.mark.parametrize("head_dim,value_head_dim,padded", [(96, 96, 128), (192, 128, 256)])
def test_split_head_dims_compile_to_fewer_products_than_padding(head_dim, value_head_dim,
                                                                padded):
    options = dict(dtype="bfloat16", causal=False, variants=Variants(),
                   value_head_dim=value_head_dim)
    split = sass(compile_variants("sm_90", head_dim=head_dim, **options))
    whole = sass(compile_variants("sm_90", head_dim=padded, **options))
    assert 0 < split.count("HGMMA") < whole.count("HGMMA")


def product_columns(code: str) -> float:
    """The warpgroup products' output columns summed over the SASS's 16-bit HGMMAs (each
    64 rows x N columns x 16 deep) per exponential of the softmax (MUFU.EX2): their work
    per score, which a loop body the compiler emits twice (as it does for some launches)
    does not change."""
    return sum(int(n) for n in re.findall(r"HGMMA\.64x(\d+)x16\.", code)) / \
        code.count("MUFU.EX2")


# The backward on the same column tiles up to D=128: dK/dV's and dQ's products of Q and K
# run on 64 + 32 (64 + 16) columns, not on the padded 128, with no spill; D_qk=192 pads to
# 256 (platforms/backward.py: tileiras 13.5 waits after every HGMMA of its split dK/dV).
@pytest.mark.parametrize("name", ["dkdv", "dq"])
@pytest.mark.parametrize("head_dim", [96, 80])
def test_split_head_dims_in_the_backward_do_less_work_than_padding(name, head_dim):
    options = dict(dtype="bfloat16", causal=True, query_group=2, value_head_dim=head_dim)
    split = compile_backward(name, "sm_90", head_dim=head_dim, **options)
    code = sass(split)
    whole = sass(compile_backward(name, "sm_90", head_dim=128, **options))
    assert 0 < product_columns(code) < product_columns(whole)
    assert_no_spills(resource_usage(split), code)


def test_backward_pads_the_head_dims_it_does_not_split():
    options = dict(dtype="bfloat16", causal=True, query_group=2, value_head_dim=128)
    assert 192 not in backward_entry_for("sm_90").launches[256]["dkdv"].split_head_dims
    assert sass(compile_backward("dkdv", "sm_90", head_dim=192, **options)) == \
        sass(compile_backward("dkdv", "sm_90", head_dim=256, **options))
    # one kernel splits 192 (below) but not 160, where splitting measured slower
    assert sass(compile_backward("dkdv_dq", "sm_90", head_dim=160, **options)) == \
        sass(compile_backward("dkdv_dq", "sm_90", head_dim=256, **options))


@pytest.mark.parametrize("value_head_dim", [128, 192])
def test_dq_added_in_dkdv_splits_head_dim_192(value_head_dim):
    """sm_90's "dkdv_dq" at D_qk=192 (D=256's on 64x64 tiles; 192/128's own on 32x128) runs
    Q's and K's columns as 128 + 64: fewer product columns per score than padded to 256,
    no spill,
    and waits for fewer than a third of its HGMMA (tileiras 13.5 waits after every one of
    the split two-kernel dK/dV's)."""
    head_dim = 192
    options = dict(dtype="bfloat16", causal=True, query_group=2, value_head_dim=value_head_dim)
    split = compile_backward("dkdv_dq", "sm_90", head_dim=head_dim, **options)
    code = sass(split)
    whole = sass(compile_backward("dkdv_dq", "sm_90", head_dim=256, **options))
    assert 0 < product_columns(code) < product_columns(whole)
    assert code.count("WARPGROUP.DEPBAR") * 3 < code.count("HGMMA")
    assert_no_spills(resource_usage(split), code)


def test_paged_tiles_of_two_blocks_multiply_from_shared_memory_as_a_dense_cache_does():
    """A 128-key tile of two 64-key blocks runs two products per matrix on the blocks'
    own TMA loads (kernels/decode.py's `attend`): as few shared-memory-to-register loads
    (LDSM) as the dense cache's kernel, not the ones a ct.cat of the blocks made."""
    options = dict(dtype="bfloat16", head_dim=128, splits=1, causal=True)
    dense = sass(compile_decode("sm_90", **options)[0])
    paged = sass(compile_decode("sm_90", block_size=64, **options)[0])
    assert paged.count("UTMALDG") > dense.count("UTMALDG")  # a load per block
    assert paged.count("LDSM") == dense.count("LDSM") > 0


@pytest.mark.parametrize("head_dim,q_len,splits,block_size", [
    (128, 8, 4, 64), (256, 8, 1, 64), (64, 8, 1, 256),  # 32 columns
    (64, 4, 1, None), (64, 4, 4, None),  # 16 columns at D=64
    (128, 16, 1, 64), (256, 16, 4, 64), (64, 16, 4, 256)])  # 64 columns
def test_decode_on_one_wave_of_16_to_64_columns_spills_nothing_with_a_producer_warp(
        head_dim, q_len, splits, block_size):
    """At 32 and 64 columns (8 and 16 new tokens at 4 query heads a K/V head; on a paged
    cache with left padding, as elsewhere 32 columns are padded to 64 and 64 run on the
    products' M side), and at 16 at D=64, a grid of one wave
    takes one CTA per SM and eight worker warps (DecodeLaunch.one_wave_columns), where two
    CTAs per SM spilled 16-416 bytes or lost the producer warp (at D=64 it takes 256-key
    tiles, which spilled 16-512 bytes at two CTAs per SM): no spill, and a producer warp
    (USETMAXREG: it hands its registers to the consumers)."""
    from cutile_fmha.steps.decode import DecodeShape, decode_plan

    shape = DecodeShape(batch=1, head_dim=head_dim, kv_heads=8, group=4, q_len=q_len,
                        capacity=splits * 4096, block_size=block_size, causal=True,
                        has_starts=True, has_lengths=True, write_lse=False, num_splits=splits)
    plan = decode_plan(shape, entry_for("sm_90").decode[head_dim], sms=132, device=None)
    assert plan.hints == {"occupancy": 1, "num_worker_warps": 8}
    assert not plan.constants["QUERIES_ON_M"]
    cubin = compile_decode("sm_90", dtype="bfloat16", head_dim=head_dim, q_len=q_len,
                           causal=True, has_starts=True, splits=splits,
                           block_size=block_size)[0]
    code = sass(cubin)
    assert_no_spills(resource_usage(cubin), code)
    assert "USETMAXREG" in code


@pytest.mark.parametrize("head_dim,q_len,splits,block_size,stack", [
    (128, 16, 1, None, 0), (128, 32, 4, None, 0), (64, 16, 4, None, 0), (64, 32, 1, None, 0),
    (256, 16, 1, None, 0), (256, 32, 4, None, 0),
    (128, 16, 4, 64, 0), (128, 32, 1, 256, 0), (64, 16, 1, 64, 0), (256, 32, 4, 128, 0),
    (128, 16, 1, 16, 0), (128, 32, 4, 16, 0), (256, 16, 1, 32, 8)])
def test_decode_with_the_columns_on_m_reduces_within_warps_and_spills_nothing(
        head_dim, q_len, splits, block_size, stack):
    """From 64 columns a dense cache's launch, and a paged one's, puts the columns on the
    products' M side (QUERIES_ON_M, DecodeLaunch.rows_columns and rows_block_size):
    warpgroup products, a producer warp, no spill, and the softmax's row reductions within
    each thread's quad (step 9's few dozen SHFL, at most 96 here with the paged cache's
    extra loops), where the transposed kernel at 128 columns had 612 SHFL and 104 bytes of
    stack (D=128). Tiles of several blocks of 16 or 32 keys may spill `stack` bytes, mostly
    in the producer warp, held to 32 registers with their block numbers (tileiras 13.5); at
    128 columns tiles of at most 4 blocks (DecodeLaunch.rows_wide_blocks) spill none where 8
    spilled 16 bytes."""
    cubin = compile_decode("sm_90", dtype="bfloat16", head_dim=head_dim, q_len=q_len,
                           causal=True, splits=splits, block_size=block_size)[0]
    code, usage = sass(cubin), resource_usage(cubin)
    if stack == 0:
        assert_no_spills(usage, code)
    else:
        assert int(re.search(r"STACK:(\d+)", usage).group(1)) <= stack, usage
    assert "USETMAXREG" in code and "HGMMA" in code
    assert code.count("SHFL") <= (64 if block_size is None else 96)


@pytest.mark.parametrize("splits", [1, 4])
def test_split_merge_starts_early_and_waits_on_the_gpu_for_the_splits(splits):
    """Split decoding lets the merge's CTAs start while the splits run (griddepcontrol:
    PREEXIT), and the merge waits for them on the GPU (ACQBULK) before reading their
    parts; an unsplit decode has no merge to let in."""
    decode, merge = (sass(cubin) for cubin in compile_decode(
        "sm_90", dtype="bfloat16", head_dim=128, splits=splits))
    assert ("PREEXIT" in decode) == (splits > 1)
    assert "ACQBULK" in merge
