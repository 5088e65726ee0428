"""The variable-length launcher: a batch of sequences of different lengths, one launch.

The tensors are (batch rows, heads, rows, D), with every sequence packed in one batch row
(flash-attn's layout, made from cu_seqlens) or each sequence in a batch row of its own,
padded (transformers' layout). ``SequenceBounds`` says where each sequence's queries and
keys are; kernels/varlen.py runs the dense kernels' code on each. Nothing here reads a
device tensor on the host: the grid comes from the shapes and the longest sequence the
caller names, so a launch never waits for the GPU and can be captured in a CUDA graph.
"""

from dataclasses import dataclass
from typing import Callable

import cuda.tile as ct
import torch

from ..kernels import step11_resident_query
from ..kernels import varlen as kernels
from ..platforms import HEAD_DIMS, PlatformEntry
from .backward import check_backward_head_dims, launch_gradient_kernels
from .definitions import QUERY_TILE_STEP, fastest_step, launch_of, step_of
from .family import (DKDV_VARLEN, DQ_VARLEN, FORWARD_TILED_HEAD_DIM_VARLEN, FORWARD_VARLEN,
                     UNUSED_ARRAY, KernelFamily, forward_constants)
from .launcher import current_stream, on_device, sinks_argument, tile_head_dim, with_hints
from .variants import NO_VARIANTS, Variants

# The dense step whose code the variable-length forward runs up to D=256, and so whose
# launch (tiles and hints per head dim, causal or not) it takes from the platform table:
# QUERY_TILE_STEP (steps/definitions.py). Past D=256 it runs the step the dense path runs
# there (10 or 11), at its launch.
RESIDENT_QUERY_STEP = step_of(step11_resident_query).number


def forward_kernel(entry: PlatformEntry, *, head_dim: int, causal: bool, query_group: int,
                   write_lse: bool, variants: Variants = NO_VARIANTS,
                   value_head_dim: int | None = None) -> tuple[object, KernelFamily, dict]:
    """(kernel with its hints, family, compile-time constants) of the variable-length
    forward with `entry`'s launch for this head dim, causal or not: the autotuner's for
    the variable-length forward where it has run (``--varlen``), else the dense step's.
    head_dim, value_head_dim: Q's and K's head dim and V's (default head_dim), whose tile
    widths ``tile_head_dim`` gives (past D=256 the head dim itself).
    `variants`: up to D=256 (the caller checks the head dim)."""
    value_tile = tile_head_dim(value_head_dim or head_dim)
    launch_dim = max(tile_head_dim(head_dim), value_tile)
    step = QUERY_TILE_STEP if launch_dim in HEAD_DIMS else fastest_step(entry, head_dim, causal)
    tiles, hints = launch_of(entry, entry.varlen_tuned.get((launch_dim, causal)), step,
                             head_dim=launch_dim, causal=causal)
    # Q and K padded to their tile width: the dense forward's split_head_dim measured
    # 1.4-3.8% slower here at D=96 (docs/performance.md, head dims 80, 96, 192).
    constants = forward_constants(tile_head_dim(head_dim), tiles, query_group=query_group,
                                  causal=causal, write_lse=write_lse, value_head_dim=value_tile)
    if launch_dim in HEAD_DIMS:
        return (with_hints(kernels.fmha, hints), FORWARD_VARLEN,
                constants | variants.constants())
    return (with_hints(kernels.fmha_tiled_head_dim, hints), FORWARD_TILED_HEAD_DIM_VARLEN,
            constants | {"RESIDENT_QUERY": step == RESIDENT_QUERY_STEP})


@dataclass(frozen=True)
class SequenceBounds:
    """Per sequence, its first and one-past-last row of the queries and of the keys, int32
    on the tensors' device (rows along axis 2 of its batch row). With no ends (None, both),
    the starts are flash-attn's cumulative lengths (one entry more than sequences):
    sequence s ends where s + 1 starts (CUMULATIVE_BOUNDS in steps/family.py)."""
    query_starts: torch.Tensor
    query_ends: torch.Tensor | None
    key_starts: torch.Tensor
    key_ends: torch.Tensor | None

    def __post_init__(self):
        if (self.query_ends is None) != (self.key_ends is None):
            raise ValueError("SequenceBounds: the query and key ends are both given or both "
                             "None (cumulative starts)")

    @classmethod
    def packed(cls, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> "SequenceBounds":
        """flash-attn's cumulative lengths: sequence s is rows cu[s]..cu[s+1]-1, read so
        in the kernels (no views: each cost a few microseconds of host time)."""
        return cls(cu_seqlens_q, None, cu_seqlens_k, None)

    @property
    def cumulative(self) -> bool:
        return self.query_ends is None

    NAMES = ("QueryStarts", "QueryEnds", "KeyStarts", "KeyEnds")  # the kernels' parameters

    def tensors(self) -> tuple[torch.Tensor | None, ...]:
        return self.query_starts, self.query_ends, self.key_starts, self.key_ends

    def arrays(self) -> tuple:
        """The kernels' arrays, in NAMES' order (UNUSED_ARRAY for absent ends)."""
        if self.query_ends is None:
            return self.packed_arrays(self.query_starts, self.key_starts)
        return self.tensors()

    @staticmethod
    def packed_arrays(cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor) -> tuple:
        """``packed(cu_seqlens_q, cu_seqlens_k).arrays()`` without making the bounds (a
        decoding step's host time)."""
        return cu_seqlens_q, UNUSED_ARRAY, cu_seqlens_k, UNUSED_ARRAY

    def values(self) -> dict:
        """The kernels' arguments, by parameter name: the arrays and CUMULATIVE_BOUNDS."""
        return dict(zip(self.NAMES, self.arrays()), CUMULATIVE_BOUNDS=self.cumulative)


def new_output(q: torch.Tensor, head_dim: int) -> torch.Tensor:
    """``torch.empty_like(q)`` with the last dimension `head_dim` (value's): in q's layout,
    so that a packed batch's output comes out packed as its queries."""
    if q.shape[-1] == head_dim:
        return torch.empty_like(q)
    strides, stride = [1] * q.dim(), head_dim
    for dim in sorted(range(q.dim() - 1), key=q.stride):  # innermost first
        strides[dim] = stride
        stride *= q.shape[dim]
    return torch.empty_strided(q.shape[:-1] + (head_dim,), strides, dtype=q.dtype,
                               device=q.device)


def _filled(t: torch.Tensor, fill: float | None) -> torch.Tensor:
    """`t` (new, uninitialised) as it is, or filled with `fill`. The kernels write only the
    rows inside some sequence: a padded batch fills the rest with 0 (and a test with NaN, to
    see that every row inside was written)."""
    return t if fill is None else t.fill_(fill)


@dataclass(frozen=True)
class ForwardPlan:
    """One shape's variable-length forward launch: everything but the arrays (the kernel,
    its grid, and the arguments after the arrays), made once per shape by a caller that
    calls it again and again (``attention_varlen`` per layer and token)."""
    kernel: object
    family: KernelFamily
    grid: tuple[int, int, int]
    settings: tuple
    arrays: Callable[[tuple], tuple]  # the family's arrays out of LAUNCH_ARRAYS' order

    def launch(self, q, k, v, out, lse, bounds: tuple, sinks=None) -> None:
        """The launch on these tensors (the shapes, strides, dtypes and device the plan was
        made for, or for a packed batch the packed tensors themselves: ``packed`` in
        steps/family.py; lse: UNUSED_ARRAY without with_lse; bounds: SequenceBounds'
        arrays() of the bounds the plan was made for, cumulative or not), on the current
        stream."""
        arrays = (q, k, v, out, lse, sinks_argument(sinks), *bounds)
        ct.launch(current_stream(q.device), self.grid, self.kernel,
                  self.arrays(arrays) + self.settings)


# The order in which ForwardPlan.launch has its arrays (a tuple, not a dict: a decoding
# step pays each microsecond of host time per layer).
LAUNCH_ARRAYS = ("Q", "K", "V", "Out", "Lse", "Sinks") + SequenceBounds.NAMES


def forward_plan(q, k, v, bounds: SequenceBounds, max_seqlen_q: int, *, causal: bool,
                 scale: float, with_lse: bool, platform: PlatformEntry | None = None,
                 variants: Variants = NO_VARIANTS) -> ForwardPlan:
    """``varlen_forward``'s launch as a plan, for tensors of these shapes and as many
    sequences (it keeps none of them)."""
    shape = dict(head_dim=q.shape[-1], value_head_dim=v.shape[-1],
                 causal=causal, query_group=q.shape[1] // k.shape[1],
                 write_lse=with_lse, variants=variants)
    kernel, family, constants = forward_kernel(platform, **shape) if platform else \
        on_device(forward_kernel, q.device, **shape)
    values = {"Q": q, **bounds.values(), "qk_scale": scale, "max_seqlen_q": max_seqlen_q,
              **constants}
    if family is FORWARD_VARLEN:
        values |= variants.scalars(q_rows=q.shape[2], k_rows=k.shape[2], causal=causal)
    return ForwardPlan(kernel, family, family.grid(values), family.settings(values),
                       family.tensors_from(LAUNCH_ARRAYS))


def varlen_forward(q, k, v, bounds: SequenceBounds, max_seqlen_q: int, *, causal: bool,
                   scale: float, with_lse: bool, fill: float | None = None,
                   platform: PlatformEntry | None = None, variants: Variants = NO_VARIANTS,
                   sinks: torch.Tensor | None = None):
    """(out, lse or None): each sequence's attention over its own keys. q (batch rows,
    heads, rows, D); k, v (batch rows, kv heads, rows, D); any strides with the last
    dimension contiguous; out has q's strides, lse is (batch rows, heads, rows) float32.
    Under `causal` each sequence's diagonal ends at its last key. Rows outside every
    sequence are left as they are, or `fill`ed (``_filled``). `platform`: another entry
    than this GPU's (the autotuner's candidates). `variants` (up to D=256; sinks (heads,)
    with variants.sinks): as kernels/variants.py, the window aligned to each sequence's last
    key."""
    plan = forward_plan(q, k, v, bounds, max_seqlen_q, causal=causal,
                        scale=scale, with_lse=with_lse, platform=platform, variants=variants)
    out = _filled(new_output(q, v.shape[-1]), fill)
    lse = _filled(q.new_empty(q.shape[:-1], dtype=torch.float32), fill) if with_lse else None
    plan.launch(q, k, v, out, lse if with_lse else UNUSED_ARRAY, bounds.arrays(), sinks)
    return out, lse


VARLEN_BACKWARD_FAMILIES = {"dkdv": DKDV_VARLEN, "dq": DQ_VARLEN, "dkdv_dq": DKDV_VARLEN}


def varlen_backward(q, k, v, out, lse, grad_out, bounds: SequenceBounds, max_seqlen_q: int,
                    max_seqlen_k: int, *, causal: bool, scale: float,
                    fill: float | None = None, variants: Variants = NO_VARIANTS,
                    delta: torch.Tensor | None = None):
    """(dq, dk, dv) of ``varlen_forward``'s out for the incoming gradient `grad_out` (out's
    shape, last dimension contiguous); `lse` is the forward's, `variants` its softcap and
    window (the sinks' terms are in the LSE); `delta`: ``row_dot`` of out and grad_out
    where the caller made it (else the kernels make it). With grouped-query heads dk and dv
    sum the gradients of the query heads that share them."""
    check_backward_head_dims(q.shape[-1], v.shape[-1])
    dq, dk, dv = (_filled(torch.empty_like(t), fill) for t in (q, k, v))
    tensors = {"Q": q, "K": k, "V": v, "dO": grad_out, "Lse": lse, "Out": out, "Delta": delta,
               "dK": dk, "dV": dv, "dQ": dq,
               **bounds.values(), "qk_scale": scale}
    launch_gradient_kernels(VARLEN_BACKWARD_FAMILIES, tensors, causal=causal,
                            grid_values={"max_seqlen_q": max_seqlen_q,
                                         "max_seqlen_k": max_seqlen_k}, module=kernels,
                            variants=variants, varlen=True)
    return dq, dk, dv
