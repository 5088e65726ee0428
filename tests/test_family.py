"""The forward families' descriptions agree with every kernel they describe."""

import ast
from pathlib import Path

import cuda.tile as ct
import pytest
import torch
from cuda.tile.compilation import ArrayConstraint, ScalarConstraint

from cutile_fmha.kernels import decode, fp8, variants, varlen
from cutile_fmha.kernels.step10_head_dim_tiling import output_chunks
from cutile_fmha.platforms import TileShape
from cutile_fmha.steps import STEPS
from cutile_fmha.steps import family as families
from cutile_fmha.steps.family import (DECODE, DKDV_VARLEN, DQ_VARLEN, FORWARD, FORWARD_FP8,
                                      FORWARD_VARIANTS, FP8_QUANTIZE,
                                      FORWARD_TENSORS, FORWARD_TILED_HEAD_DIM, FORWARD_VARLEN,
                                      MERGE_SPLITS, UNUSED_ARRAY, Constant, KeptArray,
                                      KernelFamily,
                                      Scalar, Tensor, forward_constants)

ALL_FAMILIES = [f for f in vars(families).values() if isinstance(f, KernelFamily)]


def parameters_of(source_file: str, kernel: str) -> tuple[str, ...]:
    module = ast.parse(Path(source_file).read_text())
    [node] = [node for node in module.body
              if isinstance(node, ast.FunctionDef) and node.name == kernel]
    return tuple(arg.arg for arg in node.args.args)


@pytest.mark.parametrize("step", sorted(STEPS))
def test_every_step_takes_its_family_parameters_in_order(step):
    assert parameters_of(STEPS[step].source_file, "fmha") == STEPS[step].family.names


@pytest.mark.parametrize("kernel,family", [("fmha", FORWARD_VARLEN), ("dkdv", DKDV_VARLEN),
                                           ("dq", DQ_VARLEN)])
def test_variable_length_kernels_take_their_family_parameters_in_order(kernel, family):
    assert parameters_of(varlen.__file__, kernel) == family.names


@pytest.mark.parametrize("module,family", [(fp8, FORWARD_FP8), (variants, FORWARD_VARIANTS)])
def test_fp8_and_variants_kernels_take_their_family_parameters_in_order(module, family):
    assert parameters_of(module.__file__, "fmha") == family.names


def test_the_float8_quantization_kernel_takes_its_family_parameters_in_order():
    assert parameters_of(fp8.__file__, "quantize") == FP8_QUANTIZE.names


def test_the_float8_quantization_grid_is_row_tiles_by_heads_by_batch():
    x = torch.empty(3, 5, 100, 64)
    assert FP8_QUANTIZE.grid({"X": x, "TILE_S": 64}) == (2, 5, 3)


@pytest.mark.parametrize("kernel,family", [("decode", DECODE), ("merge_splits", MERGE_SPLITS)])
def test_decode_kernels_take_their_family_parameters_in_order(kernel, family):
    assert parameters_of(decode.__file__, kernel) == family.names


def test_decode_grids_are_tiles_and_splits_by_kv_heads_by_batch_and_rows_by_kv_heads_by_batch():
    sizes = {"batch": 3, "kv_heads": 8, "q_len": 2, "splits": 5, "QUERY_GROUP": 4,
             "COLUMN_TILES": 1}
    assert DECODE.grid(sizes) == (5, 8, 3)
    assert DECODE.grid(sizes | {"COLUMN_TILES": 4}) == (20, 8, 3)  # column tiles x splits
    assert MERGE_SPLITS.grid(sizes) == (8, 8, 3)


def test_variable_length_grid_is_longest_sequence_tiles_by_heads_by_sequences():
    q = torch.empty(1, 8, 5000, 64, device="meta")
    bounds = {name: torch.empty(7, dtype=torch.int32, device="meta")
              for name in ("QueryStarts", "QueryEnds", "KeyStarts", "KeyEnds")}
    values = {"Q": q, **bounds, **forward_constants(64, TileShape(128, 64), causal=True,
                                                    write_lse=False), "CUMULATIVE_BOUNDS": False}
    assert FORWARD_VARLEN.grid(values | {"max_seqlen_q": 1000}) == (8, 8, 7)
    assert FORWARD_VARLEN.grid(values | {"max_seqlen_q": 0}) == (1, 8, 7)  # at least one
    # cu_seqlens: one entry more than sequences
    assert FORWARD_VARLEN.grid(values | {"max_seqlen_q": 1000, "CUMULATIVE_BOUNDS": True}) == \
        (8, 8, 6)


def test_arguments_follow_the_parameter_order_and_refuse_missing_values():
    values = {name: i for i, name in enumerate(FORWARD.names)}
    assert FORWARD.arguments(values) == tuple(range(len(FORWARD.names)))
    del values["Lse"]
    with pytest.raises(KeyError, match="forward kernels take"):
        FORWARD.arguments(values)


def test_tensors_then_settings_are_the_arguments_and_arrays_come_first():
    for family in ALL_FAMILIES:
        values = {name: i for i, name in enumerate(family.names)}
        assert family.tensors(values) + family.settings(values) == family.arguments(values)
        assert family.tensor_names == family.names[:len(family.tensor_names)]
    with pytest.raises(ValueError, match="array parameters come first"):
        KernelFamily("scalar first", (Scalar("x", ct.float32), Tensor("Q", 4)), FORWARD.grid)


def test_grid_is_query_tiles_by_heads_by_batch():
    q = torch.empty(3, 5, 1000, 64, device="meta")
    values = {"Q": q, **forward_constants(64, TileShape(64, 128), causal=True, write_lse=False)}
    assert FORWARD.grid(values) == (16, 5, 3)


def test_tiled_head_dim_grid_has_a_cta_per_output_slice_of_each_query_tile():
    q = torch.empty(3, 5, 1000, 1024, device="meta")
    tiles = TileShape(64, 64, tile_k=64, tile_v=512)
    values = {"Q": q, **forward_constants(1024, tiles, causal=True, write_lse=True)}
    assert values["TILE_K"] == 64 and values["TILE_V"] == 512
    assert FORWARD_TILED_HEAD_DIM.grid(values) == (16 * 2, 5, 3)
    assert not {"TILE_K", "TILE_V"} & set(FORWARD.names)  # the plain family does not take them


@pytest.mark.parametrize("width", [64, 320, 384, 448, 512, 576, 704, 1024])
def test_output_chunks_are_powers_of_two_at_offsets_that_are_tile_indices(width):
    chunks = output_chunks(width)
    assert sum(chunk for _, chunk in chunks) == width and chunks[0][0] == 0
    for (offset, chunk), (next_offset, _) in zip(chunks, chunks[1:] + ((width, 0),)):
        assert chunk & (chunk - 1) == 0 and chunk <= 256
        assert offset % chunk == 0 and next_offset == offset + chunk
    assert output_chunks(448) == ((0, 256), (256, 128), (384, 64))


def test_forward_families_start_with_the_tensors_a_plan_launches_on():
    for step in STEPS.values():
        assert step.family.names[:len(FORWARD_TENSORS)] == FORWARD_TENSORS


def test_an_array_is_left_unread_only_under_a_boolean_constant_of_its_family():
    unread = {}
    for family in ALL_FAMILIES:
        constants = {p.name for p in family.parameters if isinstance(p, Constant)}
        for p in family.parameters:
            switches = {p.read_when, p.read_unless} - {None} if isinstance(p, Tensor) else ()
            if switches:
                assert switches <= constants, (family.name, p.name)
                unread.setdefault(family.name, set()).add(p.name)
    assert unread["decode"] == {"Lse", "Partial", "PartialLse", "KeyStarts", "KeyEnds",
                                "BlockTable", "Sinks"}
    assert unread["forward"] == {"Lse"} and unread["forward, variants"] == {"Lse", "Sinks"}
    # with cu_seqlens, the variable-length kernels read no ends
    assert unread["backward dkdv, variable length"] == {"QueryEnds", "KeyEnds", "dQAcc"}
    assert unread["backward dkdv"] == {"dQAcc"}  # read under ATOMIC_DQ only
    assert unread["backward dq"] == {"Out"}  # read under DELTA_FROM_OUT only


def test_an_unread_array_compiles_as_the_int_scalar_a_launch_passes():
    constants = {p.name: False for p in DECODE.parameters if isinstance(p, Constant)}
    signature = DECODE.signature(ct.bfloat16, constants | {"HAS_LENGTHS": True})
    kinds = {p.name: type(c) for p, c in zip(DECODE.parameters, signature.parameters)
             if isinstance(p, Tensor)}
    assert kinds == {"Q": ArrayConstraint, "K": ArrayConstraint, "V": ArrayConstraint,
                     "Out": ArrayConstraint, "Lse": ScalarConstraint,
                     "Partial": ScalarConstraint, "PartialLse": ScalarConstraint,
                     "KeyStarts": ScalarConstraint, "KeyEnds": ArrayConstraint,
                     "BlockTable": ScalarConstraint, "Sinks": ScalarConstraint}
    assert isinstance(UNUSED_ARRAY, int)  # what ct.launch takes for an int32 scalar


def declared_rows(family: KernelFamily, rows_multiple: int) -> dict[str, tuple[int, ...]]:
    """Each array parameter's shape divisors in `family`'s export signature (every
    constant on, so that every array is read)."""
    constants = {p.name: True for p in family.parameters if isinstance(p, Constant)}
    constants |= {"TILE_D_TAIL": 0}
    signature = family.signature(ct.bfloat16, constants, rows_multiple)
    return {p.name: c.shape_divisible_by for p, c in zip(family.parameters, signature.parameters)
            if isinstance(c, ArrayConstraint)}


@pytest.mark.parametrize("family", [families.FORWARD, FORWARD_VARIANTS, FORWARD_FP8,
                                    families.ROW_DOT, families.DKDV, families.DQ])
def test_the_export_declares_the_dense_families_rows_a_multiple_when_asked(family):
    """rows_multiple reaches the sequence-row dimension of every (batch, heads, rows[, D])
    array, FP8's V stored (batch, heads, D, rows) included, and nothing else; the head dim
    is declared a multiple of 16 either way."""
    for name, divisors in declared_rows(family, 16).items():
        if name.endswith("Descale") or name == "Sinks":
            assert set(divisors) == {1}, name
            continue
        rows = 3 if family is FORWARD_FP8 and name == "V" else 2
        assert divisors[rows] == 16 and divisors[:2] == (1, 1), (name, divisors)
        assert declared_rows(family, 1)[name][rows] == 1


def test_packed_tensors_declare_no_rows():
    """A packed tensor's first dimension is every sequence's tokens: rows_multiple does
    not reach it."""
    packed = families.packed(FORWARD_VARLEN)
    assert all(p.rows_dim is None for p in packed.parameters
               if isinstance(p, Tensor) and p.rank == 3)
    assert declared_rows(packed, 16) == declared_rows(packed, 1)


def test_cumulative_bounds_compile_the_ends_as_the_int_scalar_a_launch_passes():
    constants = {p.name: False for p in DQ_VARLEN.parameters if isinstance(p, Constant)}
    for cumulative, ends in ((True, ScalarConstraint), (False, ArrayConstraint)):
        signature = DQ_VARLEN.signature(ct.bfloat16, constants | {"CUMULATIVE_BOUNDS": cumulative})
        kinds = {p.name: type(c) for p, c in zip(DQ_VARLEN.parameters, signature.parameters)
                 if p.name.startswith(("Query", "Key"))}
        assert kinds == {"QueryStarts": ArrayConstraint, "QueryEnds": ends,
                         "KeyStarts": ArrayConstraint, "KeyEnds": ends}


def test_a_positional_launch_passes_the_arrays_in_the_familys_order():
    reordered = tuple(reversed(MERGE_SPLITS.tensor_names)) + ("NotAParameter",)
    arrays = tuple(f"array {name}" for name in reordered)
    assert MERGE_SPLITS.tensors_from(reordered)(arrays) == \
        tuple(f"array {name}" for name in MERGE_SPLITS.tensor_names)
    with pytest.raises(KeyError, match="PartialLse"):
        MERGE_SPLITS.tensors_from(("Partial", "Out", "Lse"))


@pytest.mark.parametrize("tensor", [torch.zeros(2, 3), torch.zeros(2, 3, dtype=torch.float16,
                                                                   device="meta")])
def test_kept_arrays_are_cuda_float32_tensors(tensor):
    """What a KeptArray's interface says (float32, "<f4") must be its tensor's: others are
    refused, not described wrongly."""
    with pytest.raises(TypeError, match="a KeptArray is a CUDA float32 tensor"):
        KeptArray(tensor)
