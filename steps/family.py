"""Kernel families: how every kernel of one family is called, described once.

A family is a set of kernels that share one parameter list and one grid (the tutorial's
forward steps are one). The launcher builds its argument tuple and grid from the
description, the compile-only export its signature, and the tests check every kernel of
the family against it; a new family is one new description here.
"""

import dataclasses
import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable

import cuda.tile as ct
import torch
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint)

from ..platforms import TileShape

TMA_ALIGNMENT_BYTES = 16  # PyTorch's allocations and strides that are multiples of this
# A run-time compile assumes of each dimension of an array what the call's shape gives
# (cuTile specializes a kernel on which of them are multiples of 16). The compile-only
# export has no shape: it assumes the head dim a multiple of this, as every head dim of the
# platform tables is, so that it builds the kernels those calls run. Without it tileiras
# stores the output's tiles element by element instead of by TMA.
HEAD_DIM_MULTIPLE = 16
# The same for the sequence rows (queries, keys) of the dense forward and backward kernels:
# every length of the tables' and the autotuner's shapes is a multiple of this, and a call
# with such lengths runs a kernel compiled for them, which an export asked for it
# (`rows_multiple`) builds too. Under tileiras 13.5 the forward that writes the LSE at
# D=256 under the causal mask then has a 72-byte stack frame, against 56 for any length.
ROWS_MULTIPLE = 16
# What a launch passes for an array its constants leave untouched (a Tensor's read_when
# off): an int, which the kernel is compiled to take as a scalar. Each array argument costs
# ct.launch about half a microsecond of host time (its DLPack conversion); a scalar, none.
UNUSED_ARRAY = 0


class KeptArray:
    """A float32 tensor that launches pass again and again (a plan's split buffers), handed
    to ct.launch as a CUDA array interface made once: ct.launch converts a torch tensor
    through DLPack on every launch, and reads this dictionary as it is. Holds the tensor."""
    __slots__ = ("tensor", "__cuda_array_interface__")

    def __init__(self, tensor):
        if tensor.dtype != torch.float32 or not tensor.is_cuda:
            raise TypeError(f"a KeptArray is a CUDA float32 tensor, got {tensor.dtype} "
                            f"on {tensor.device}")
        self.tensor = tensor
        self.__cuda_array_interface__ = {
            "shape": tuple(tensor.shape), "typestr": "<f4", "data": (tensor.data_ptr(), False),
            "strides": tuple(4 * s for s in tensor.stride()), "version": 3}


@dataclass(frozen=True)
class Tensor:
    """An array parameter; its dtype is the inputs' (None) or a fixed one. Its base address
    and strides are 16-byte aligned, as a PyTorch allocation of a typical size is, unless
    it may be a view that starts anywhere or has any row length (`aligned=False`: sequence
    bounds, a block table). `read_when`: the boolean constant without which the kernels
    never touch it (None: always read); `read_unless`: the one with which they never do
    (None: none); a launch then passes UNUSED_ARRAY. `float32_when`: the boolean constant
    with which it is float32 whatever the inputs' dtype. `head_dim_last`: its last dimension
    is the head dim (``HEAD_DIM_MULTIPLE``). `rows_dim`: its dimension of sequence rows in
    the dense families' layouts (``ROWS_MULTIPLE``)."""
    name: str
    rank: int
    dtype: ct.DType | None = None
    aligned: bool = True
    read_when: str | None = None
    read_unless: str | None = None
    float32_when: str | None = None
    head_dim_last: bool = False
    rows_dim: int | None = None

    def read(self, constants: dict) -> bool:
        """Whether a launch with these constants reads this array."""
        return (self.read_when is None or bool(constants[self.read_when])) and \
            (self.read_unless is None or not constants[self.read_unless])

    def constraint(self, input_dtype: ct.DType, rows_multiple: int = 1) -> ArrayConstraint:
        """Last dimension contiguous, other strides multiples of 16 bytes (of one element
        where not `aligned`); a head dim last, a multiple of HEAD_DIM_MULTIPLE; the rows a
        multiple of `rows_multiple`."""
        dtype = self.dtype or input_dtype
        per_alignment = TMA_ALIGNMENT_BYTES // (dtype.bitwidth // 8) if self.aligned else 1
        shape_divisible_by = [1] * (self.rank - 1) + \
            [HEAD_DIM_MULTIPLE if self.head_dim_last else 1]
        if self.rows_dim is not None:
            shape_divisible_by[self.rows_dim] = rows_multiple
        return ArrayConstraint(dtype, self.rank, index_dtype=ct.int32, stride_lower_bound_incl=0,
                               alias_groups=(), may_alias_internally=False,
                               stride_constant=(None,) * (self.rank - 1) + (1,),
                               stride_divisible_by=(per_alignment,) * (self.rank - 1) + (1,),
                               shape_divisible_by=tuple(shape_divisible_by),
                               base_addr_divisible_by=TMA_ALIGNMENT_BYTES if self.aligned
                               else dtype.bitwidth // 8)


@dataclass(frozen=True)
class Scalar:
    name: str
    dtype: ct.DType


@dataclass(frozen=True)
class Constant:
    """A compile-time parameter (``ct.Constant``): each value is its own compiled kernel."""
    name: str


def tuple_getter(keys: tuple) -> Callable:
    """operator.itemgetter(*keys), but a tuple for any number of keys (itemgetter gives
    one key's value as it is)."""
    if len(keys) == 1:
        [key] = keys
        return lambda values: (values[key],)
    return operator.itemgetter(*keys) if keys else lambda values: ()


@dataclass(frozen=True)
class KernelFamily:
    name: str
    parameters: tuple[Tensor | Scalar | Constant, ...]  # in the kernels' order
    grid: Callable[[dict], tuple[int, int, int]]  # from the launch's values, by name

    def __post_init__(self):
        tensors = len(self.tensor_names)
        if any(isinstance(p, Tensor) for p in self.parameters[tensors:]):
            raise ValueError(f"{self.name}: the array parameters come first (a plan keeps the "
                             f"rest, its settings, and launches them on new tensors)")

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    @functools.cached_property
    def tensor_names(self) -> tuple[str, ...]:
        """The array parameters' names: the first parameters."""
        return tuple(p.name for p in self.parameters if isinstance(p, Tensor))

    @functools.cached_property
    def _pick(self) -> Callable[[dict], tuple]:
        return tuple_getter(self.names)

    @functools.cached_property
    def _pick_tensors(self) -> Callable[[dict], tuple]:
        return tuple_getter(self.tensor_names)

    @functools.cached_property
    def _pick_settings(self) -> Callable[[dict], tuple]:
        return tuple_getter(self.names[len(self.tensor_names):])

    def _picked(self, pick, values: dict) -> tuple:
        try:
            return pick(values)
        except KeyError as missing:
            raise KeyError(f"{self.name} kernels take {self.names}, got no {missing}") from None

    def arguments(self, values: dict) -> tuple:
        """The argument tuple for ``ct.launch``, from a value for every parameter name
        (other names in `values` are left out: what only the grid reads)."""
        return self._picked(self._pick, values)

    def tensors(self, values: dict) -> tuple:
        """``arguments``' first part, the arrays: what changes from call to call."""
        return self._picked(self._pick_tensors, values)

    def tensors_from(self, names: tuple[str, ...]) -> Callable[[tuple], tuple]:
        """A picker of the arrays in this family's order out of a tuple of arrays named
        `names`: for a plan made once that launches its arrays positionally (no dict per
        call)."""
        missing = [name for name in self.tensor_names if name not in names]
        if missing:
            raise KeyError(f"{self.name} kernels take {self.tensor_names}, got no {missing}")
        return tuple_getter(tuple(names.index(name) for name in self.tensor_names))

    def settings(self, values: dict) -> tuple:
        """``arguments``' second part, after the arrays (scalars and constants): what a
        plan made once per shape keeps, so that a call is ``tensors(...) + settings``."""
        return self._picked(self._pick_settings, values)

    def signature(self, input_dtype: ct.DType, constants: dict,
                  rows_multiple: int = 1) -> KernelSignature:
        """The compile-only signature for inputs of `input_dtype` and these constants,
        sequence rows a multiple of `rows_multiple`."""
        parameters = []
        for p in self.parameters:
            if isinstance(p, Tensor):
                dtype = ct.float32 if p.float32_when and constants[p.float32_when] \
                    else input_dtype
                parameters.append(p.constraint(dtype, rows_multiple) if p.read(constants)
                                  else ScalarConstraint(ct.int32))  # UNUSED_ARRAY
            elif isinstance(p, Scalar):
                parameters.append(ScalarConstraint(p.dtype))
            else:
                parameters.append(constants[p.name])
        return KernelSignature(parameters, CallingConvention.cutile_python_v1())


# fmha(Q, K, V, Out, Lse, qk_scale, query_offset,
#      TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE)
# Q, Out: (batch, heads, q_len, D); K, V: (batch, heads // QUERY_GROUP, k_len, D); Lse:
# (batch, heads, q_len) float32, written only when WRITE_LSE. Under CAUSAL, query row i
# sees keys j <= i + query_offset. One CTA per TILE_M query rows of one head. The group
# is a constant: on tileiras 13.5 a run-time one (heads // kv_heads) measured 3% slower.
def tiles_per_head(tensor: str, tile: str) -> Callable[[dict], tuple[int, int, int]]:
    """The grid of one CTA per `tile` rows of `tensor` (batch, heads, rows, D), per head
    and batch."""
    return lambda values: (math.ceil(values[tensor].shape[2] / values[tile]),
                           values[tensor].shape[1], values[tensor].shape[0])


_QKV = tuple(Tensor(name, 4, head_dim_last=True, rows_dim=2) for name in ("Q", "K", "V"))
_OUT = Tensor("Out", 4, head_dim_last=True, rows_dim=2)
# Every forward family's first parameters: a plan's launch on new tensors replaces these.
FORWARD_TENSORS = ("Q", "K", "V", "Out", "Lse")
# What every attention kernel (forward, dK/dV, dQ) takes after its tensors.
_ATTENTION_SETTINGS = (Scalar("qk_scale", ct.float32), Scalar("query_offset", ct.int32),
                       Constant("TILE_D"), Constant("TILE_M"), Constant("TILE_N"),
                       Constant("QUERY_GROUP"), Constant("CAUSAL"))
_LSE = Tensor("Lse", 3, ct.float32, read_when="WRITE_LSE", rows_dim=2)
_SINKS = Tensor("Sinks", 1, ct.float32, aligned=False, read_when="SINKS")
FORWARD = KernelFamily(
    name="forward",
    parameters=_QKV + (_OUT, _LSE) + _ATTENTION_SETTINGS + (Constant("WRITE_LSE"),),
    grid=tiles_per_head("Q", "TILE_M"),
)


# The FP8 forward (kernels/fp8.py): Q, K float8_e4m3fn as in FORWARD, V stored transposed
# (batch, kv_heads, D, k_len), Out bfloat16, and after Lse the float32 dequantization
# factors of Q (batch, heads), K and V (batch, kv_heads); FMA_EXP2 (the launch's fma_exp2:
# a share of the exponentials on the FMA pipes, 0 none). The grid is FORWARD's.
FORWARD_FP8 = KernelFamily(
    name="forward, float8",
    parameters=_QKV[:2] + (Tensor("V", 4, rows_dim=3),
                           Tensor("Out", 4, ct.bfloat16, head_dim_last=True, rows_dim=2), _LSE)
    + tuple(Tensor(name, 2, ct.float32, aligned=False)
            for name in ("QDescale", "KDescale", "VDescale"))
    + _ATTENTION_SETTINGS + (Constant("WRITE_LSE"), Constant("FMA_EXP2")),
    grid=tiles_per_head("Q", "TILE_M"),
)


# to_fp8's quantization (kernels/fp8.py's ``quantize``): X (batch, heads, rows, D) in the
# inputs' dtype, its float32 Descale (batch, heads), Out float8_e4m3fn, (batch, heads,
# rows, D) or, with TRANSPOSE, (batch, heads, D, rows rounded up to 16). One CTA per TILE_S
# rows of one head: the grid covers every column of a transposed Out.
FP8_QUANTIZE = KernelFamily(
    name="float8 quantization",
    parameters=(Tensor("X", 4), Tensor("Descale", 2, ct.float32, aligned=False),
                Tensor("Out", 4, ct.float8_e4m3fn), Constant("TILE_S"), Constant("TILE_D"),
                Constant("TRANSPOSE")),
    grid=tiles_per_head("X", "TILE_S"),
)


# The variants (kernels/variants.py): FORWARD's tensors and Sinks (heads,) float32, its
# scalars and softcap, window_left, window_right, its constants and SOFTCAP, WINDOW, SINKS,
# each turning one variant on (Sinks, softcap and the window are read only then). The grid
# is FORWARD's.
# TILE_D_TAIL after TILE_D: Q's and K's columns past TILE_D, a second product of their own
# (0: none; steps/launcher.py's split_head_dim: D=96 runs 64 + 32 columns). TILE_DV is V's
# and Out's tile width (the head dims step 9's code pads: V's head dim may differ from Q's
# and K's; steps/launcher.py's tile_head_dim).
VARIANT_CONSTANTS = ("SOFTCAP", "WINDOW", "SINKS")
_VARIANT_SCALARS = (Scalar("softcap", ct.float32), Scalar("window_left", ct.int32),
                    Scalar("window_right", ct.int32))
_PADDED_TILES = _ATTENTION_SETTINGS[2:3] + (Constant("TILE_DV"),) + _ATTENTION_SETTINGS[3:]
FORWARD_VARIANTS = KernelFamily(
    name="forward, variants",
    parameters=_QKV + (_OUT, _LSE, _SINKS)
    + _ATTENTION_SETTINGS[:2] + _VARIANT_SCALARS + _PADDED_TILES[:1]
    + (Constant("TILE_D_TAIL"),) + _PADDED_TILES[1:] + (Constant("WRITE_LSE"),)
    + tuple(Constant(name) for name in VARIANT_CONSTANTS),
    grid=tiles_per_head("Q", "TILE_M"),
)


def _query_tiles_by_output_slices(values: dict) -> tuple[int, int, int]:
    batch, heads, q_len, _ = values["Q"].shape
    slices = values["TILE_D"] // values["TILE_V"]
    return math.ceil(q_len / values["TILE_M"]) * slices, heads, batch


# Steps 10-11 (head dim tiled) take the forward's parameters and, before WRITE_LSE, TILE_K
# (head-dim columns per product of Q K^T) and TILE_V (output columns per CTA, dividing
# TILE_D). D / TILE_V CTAs per TILE_M query rows of one head, side by side in grid.x.
FORWARD_TILED_HEAD_DIM = KernelFamily(
    name="forward, head dim tiled",
    parameters=FORWARD.parameters[:-1] + (Constant("TILE_K"), Constant("TILE_V"))
    + FORWARD.parameters[-1:],
    grid=_query_tiles_by_output_slices,
)


# Variable-length batches (kernels/varlen.py). Q, K, V, Out, Lse are (batch rows, heads,
# rows, D) as in the dense families, with every sequence packed in one batch row or each in
# its own (padding). Each sequence s has rows QueryStarts[s]..QueryEnds[s]-1 of Q, Out and
# Lse, and KeyStarts[s]..KeyEnds[s]-1 of K and V (int32, one per sequence). Under
# CUMULATIVE_BOUNDS, the last constant, the starts are flash-attn's cu_seqlens as they come
# (one entry more than sequences) and sequence s ends at QueryStarts[s + 1] and
# KeyStarts[s + 1]: the ends are not passed, two arrays fewer to convert per launch. Under
# CAUSAL the diagonal is aligned to each sequence's last key, so there is no query_offset.
# One CTA per TILE_M query rows (dK/dV: TILE_N keys) of the longest sequence, per head and
# sequence.
SEQUENCE_BOUNDS = tuple(Tensor(name, 1, ct.int32, aligned=False,
                               read_unless="CUMULATIVE_BOUNDS" if name.endswith("Ends") else None)
                        for name in ("QueryStarts", "QueryEnds", "KeyStarts", "KeyEnds"))


def tiles_per_sequence(length: str, tile: str,
                       heads_of: str) -> Callable[[dict], tuple[int, int, int]]:
    """The grid of one CTA per `tile` rows of the longest sequence (`length`: at least one
    CTA), per head of `heads_of` and per sequence. What a sequence longer than `length`
    gets is the kernels' (kernels/varlen.py): NaN past the grid."""
    return lambda values: (max(math.ceil(values[length] / values[tile]), 1),
                           values[heads_of].shape[1], sequences(values))


def sequences(values: dict) -> int:
    """How many sequences a variable-length launch's bounds hold."""
    starts = values["QueryStarts"].shape[0]
    return starts - 1 if values["CUMULATIVE_BOUNDS"] else starts


def _varlen(family: KernelFamily, grid, extra_constants: tuple[str, ...] = ()) -> KernelFamily:
    """`family` over variable-length sequences: the sequence bounds after its tensors, no
    query_offset, and `extra_constants` and CUMULATIVE_BOUNDS last."""
    tensors = tuple(p for p in family.parameters if isinstance(p, Tensor))
    settings = tuple(p for p in family.parameters
                     if not isinstance(p, Tensor) and p.name != "query_offset")
    return KernelFamily(name=f"{family.name}, variable length",
                        parameters=tensors + SEQUENCE_BOUNDS + settings
                        + tuple(Constant(name)
                                for name in extra_constants + ("CUMULATIVE_BOUNDS",)),
                        grid=grid)


def attention_constants(head_dim: int, tiles: TileShape, *, query_group: int = 1,
                        causal: bool, value_head_dim: int | None = None) -> dict:
    """The compile-time parameters every attention kernel takes for one launch, and
    TILE_DV, V's tile width (`value_head_dim`, default head_dim), which the families on
    step 9's padded tiles take."""
    return {"TILE_D": head_dim, "TILE_DV": value_head_dim or head_dim, "TILE_M": tiles.tile_m,
            "TILE_N": tiles.tile_n, "QUERY_GROUP": query_group, "CAUSAL": causal}


def backward_constants(head_dim: int, tiles: TileShape, *, query_group: int = 1,
                       causal: bool, variants=None, value_head_dim: int | None = None,
                       head_dim_tail: int = 0, atomic_dq: bool = False,
                       add_to_dkdv: bool = False, dq_late: bool = False,
                       delta_from_out: bool = False) -> dict:
    """The compile-time parameters of one dK/dV or dQ launch, with the softcap and window
    of `variants` compiled in (steps/variants.py's Variants; None: neither), Q's and K's
    columns past head_dim as a tile of `head_dim_tail` (the forward's TILE_D_TAIL),
    dK/dV's ATOMIC_DQ (`atomic_dq`), ADD_TO_DKDV (`add_to_dkdv`) and DQ_LATE (`dq_late`),
    and dQ's DELTA_FROM_OUT (`delta_from_out`); each family takes its own."""
    switches = variants.constants() if variants is not None else {}
    return attention_constants(head_dim, tiles, query_group=query_group, causal=causal,
                               value_head_dim=value_head_dim) | {"TILE_D_TAIL": head_dim_tail} | {
        name: switches.get(name, False) for name in BACKWARD_VARIANT_CONSTANTS} | {
        "ATOMIC_DQ": atomic_dq, "ADD_TO_DKDV": add_to_dkdv, "DQ_LATE": dq_late,
        "DELTA_FROM_OUT": delta_from_out}


def forward_constants(head_dim: int, tiles: TileShape, *, query_group: int = 1,
                      causal: bool, write_lse: bool, value_head_dim: int | None = None,
                      head_dim_tail: int = 0) -> dict:
    """The compile-time parameters of one forward launch: the FORWARD family's (with
    FORWARD_VARIANTS's TILE_D_TAIL, `head_dim_tail`, and TILE_DV), and with tiles that
    tile the head dim (tile_k set) FORWARD_TILED_HEAD_DIM's."""
    constants = attention_constants(head_dim, tiles, query_group=query_group, causal=causal,
                                    value_head_dim=value_head_dim)
    if tiles.tile_k is not None:
        constants |= {"TILE_K": tiles.tile_k, "TILE_V": tiles.tile_v}
    return constants | {"TILE_D_TAIL": head_dim_tail, "WRITE_LSE": write_lse}


# The backward pass (kernels/backward.py): three kernels, each its own family.
# row_dot(Out, dOut, Delta, TILE_M, TILE_D): Delta (batch, heads, q_len) float32.
ROW_DOT = KernelFamily(
    name="backward row_dot",
    parameters=(_OUT, Tensor("dOut", 4, head_dim_last=True, rows_dim=2),
                Tensor("Delta", 3, ct.float32, rows_dim=2),
                Constant("TILE_M"), Constant("TILE_D")),
    grid=tiles_per_head("Out", "TILE_M"),
)
_BACKWARD_INPUTS = _QKV + (Tensor("dO", 4, head_dim_last=True, rows_dim=2),
                           Tensor("Lse", 3, ct.float32, rows_dim=2),
                           Tensor("Delta", 3, ct.float32, rows_dim=2))
# After their tensors both take FORWARD_VARIANTS's settings (the softcap's and the window's
# run-time values, TILE_D_TAIL, TILE_DV), and SOFTCAP and WINDOW last (the sinks' terms are
# in the LSE): each a constant that turns its variant on.
BACKWARD_VARIANT_CONSTANTS = ("SOFTCAP", "WINDOW")
_BACKWARD_SETTINGS = _ATTENTION_SETTINGS[:2] + _VARIANT_SCALARS + _PADDED_TILES[:1] \
    + (Constant("TILE_D_TAIL"),) + _PADDED_TILES[1:] \
    + tuple(Constant(name) for name in BACKWARD_VARIANT_CONSTANTS)
# dkdv(...): one CTA per TILE_N keys of one K/V head; dK, dV like K, V. With ATOMIC_DQ
# it also adds each query's dQ * qk_scale to dQAcc, float32 like Q, zeroed first; with
# ADD_TO_DKDV it adds its dK and dV to the float32 ones it is handed; with DQ_LATE (last)
# each pair's dQ goes one turn late (kernels/backward.py's accumulate_dkdv).
DKDV = KernelFamily(
    name="backward dkdv",
    parameters=_BACKWARD_INPUTS
    + tuple(Tensor(name, 4, float32_when="ADD_TO_DKDV", head_dim_last=True, rows_dim=2)
            for name in ("dK", "dV"))
    + (Tensor("dQAcc", 4, ct.float32, read_when="ATOMIC_DQ", head_dim_last=True,
              rows_dim=2),)
    + _BACKWARD_SETTINGS + tuple(Constant(name)
                                 for name in ("ATOMIC_DQ", "ADD_TO_DKDV", "DQ_LATE")),
    grid=tiles_per_head("K", "TILE_N"),
)
# dq(...): one CTA per TILE_M query rows of one head; dQ like Q. With DELTA_FROM_OUT (last)
# it computes Delta from Out and dO and writes it, for the dK/dV kernel launched after.
DQ = KernelFamily(
    name="backward dq",
    parameters=_BACKWARD_INPUTS + (Tensor("dQ", 4, head_dim_last=True, rows_dim=2),
                                   dataclasses.replace(_OUT, read_when="DELTA_FROM_OUT"))
    + _BACKWARD_SETTINGS + (Constant("DELTA_FROM_OUT"),),
    grid=tiles_per_head("Q", "TILE_M"),
)


# Up to D=256 with the variants (FORWARD_VARIANTS's parameters).
FORWARD_VARLEN = _varlen(FORWARD_VARIANTS, tiles_per_sequence("max_seqlen_q", "TILE_M", "Q"))


def _tiled_head_dim_varlen_grid(values: dict) -> tuple[int, int, int]:
    q_tiles, heads, sequences = tiles_per_sequence("max_seqlen_q", "TILE_M", "Q")(values)
    return q_tiles * (values["TILE_D"] // values["TILE_V"]), heads, sequences


# Past D=256, steps 10 and 11 over variable-length sequences: one kernel, whose
# RESIDENT_QUERY picks step 11's query tile (else step 10's); D / TILE_V CTAs side by side
# per query tile, as in their dense grid.
FORWARD_TILED_HEAD_DIM_VARLEN = _varlen(FORWARD_TILED_HEAD_DIM, _tiled_head_dim_varlen_grid,
                                        extra_constants=("RESIDENT_QUERY",))
DKDV_VARLEN = _varlen(DKDV, tiles_per_sequence("max_seqlen_k", "TILE_N", "K"))
DQ_VARLEN = _varlen(DQ, tiles_per_sequence("max_seqlen_q", "TILE_M", "Q"))

# A packed batch's forward may pass its packed tensors themselves, one rank less: Q, K, V,
# Out (tokens, heads, D), Lse (heads, tokens); the kernel sees them as one batch row.
PACKED_RANKS = {"Q": 3, "K": 3, "V": 3, "Out": 3, "Lse": 2}


def packed(family: KernelFamily) -> KernelFamily:
    """A variable-length forward `family` called with the packed tensors (PACKED_RANKS):
    the same kernels, compiled for arrays of those ranks."""
    return dataclasses.replace(family, name=f"{family.name}, packed", parameters=tuple(
        dataclasses.replace(p, rank=PACKED_RANKS[p.name], rows_dim=None)
        if isinstance(p, Tensor) and p.name in PACKED_RANKS else p for p in family.parameters))


# Decoding from a KV cache (kernels/decode.py). Q: (batch, heads, q_len, D), Out: the same
# with V's head dim D_v, Lse (batch, heads, q_len); K, V: the dense cache (batch, kv_heads,
# capacity, D or D_v) or, under PAGED, the paged one (blocks, BLOCK_SIZE, kv_heads, D or D_v)
# with BlockTable (batch, blocks per sequence); TILE_D and TILE_DV the tiles' widths.
# Sequence b's keys are KeyStarts[b] (HAS_STARTS; else 0) to KeyEnds[b]-1 (HAS_LENGTHS;
# else the capacity). One CTA per split, K/V
# head and sequence; with more than one split (SPLIT) the CTAs write Partial and
# PartialLse, (batch, kv_heads, splits, GROUP_TILE * QUERY_ROWS[, D_v]) float32, and
# MERGE_SPLITS writes Out and Lse from them: one CTA per query row of each head. Both
# grids come from the launch's sizes (batch, kv_heads, q_len, splits), not its tensors.
# QUERIES_ON_M: the products take the columns as their M side (DecodeLaunch.choose).
# COLUMN_TILES: the columns cut into that many CTAs' tiles, grid dimension 0 tiles x splits.
_CACHE_LOOKUP = tuple(Tensor(name, 1, ct.int32, aligned=False, read_when=switch)
                      for name, switch in (("KeyStarts", "HAS_STARTS"),
                                           ("KeyEnds", "HAS_LENGTHS"))) + \
    (Tensor("BlockTable", 2, ct.int32, aligned=False, read_when="PAGED"),)
_OUTPUTS_AND_PARTIALS = (_OUT, _LSE,
                         Tensor("Partial", 5, ct.float32, read_when="SPLIT",
                                head_dim_last=True),
                         Tensor("PartialLse", 4, ct.float32, read_when="SPLIT"))
# The variants as in FORWARD_VARIANTS: Sinks after the lookups, softcap, window_left (keys
# before each row's diagonal) and window_right (how far the causal mask's diagonal moves:
# the window's right side is the causal mask's) after qk_scale, SOFTCAP, WINDOW and SINKS
# last.
DECODE = KernelFamily(
    name="decode",
    parameters=_QKV + _OUTPUTS_AND_PARTIALS + _CACHE_LOOKUP
    + (_SINKS, Scalar("qk_scale", ct.float32))
    + _VARIANT_SCALARS
    + tuple(Constant(name) for name in ("TILE_D", "TILE_DV", "TILE_N", "QUERY_GROUP",
                                        "GROUP_TILE", "QUERY_ROWS", "CAUSAL", "PAGED",
                                        "BLOCK_SIZE", "HAS_STARTS", "HAS_LENGTHS", "SPLIT",
                                        "WRITE_LSE")
          + VARIANT_CONSTANTS + ("QUERIES_ON_M", "COLUMN_TILES", "D_TAIL")),
    grid=lambda values: (values["splits"] * values["COLUMN_TILES"], values["kv_heads"],
                         values["batch"]),
)
MERGE_SPLITS = KernelFamily(
    name="decode merge_splits",
    parameters=(Tensor("Partial", 5, ct.float32, head_dim_last=True),
                Tensor("PartialLse", 4, ct.float32), _OUT, _LSE, Constant("TILE_DV"),
                Constant("SPLITS_TILE"), Constant("QUERY_GROUP"), Constant("QUERY_ROWS"),
                Constant("WRITE_LSE")),
    grid=lambda values: (values["QUERY_GROUP"] * values["q_len"], values["kv_heads"],
                         values["batch"]),
)


# Each row's run of real tokens in a padding mask (kernels/padding.py): Mask (batch,
# length), nonzero on real tokens, of any integer or boolean dtype and row stride; Runs
# (3, batch) int32: each row's first real column, one past its last, and its status. One
# CTA per row.
PADDING_RUNS = KernelFamily(
    name="padding runs",
    parameters=(Tensor("Mask", 2, aligned=False), Tensor("Runs", 2, ct.int32, aligned=False),
                Constant("TILE")),
    grid=lambda values: (values["batch"], 1, 1),
)
