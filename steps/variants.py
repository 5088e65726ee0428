"""The variants' launcher (kernels/variants.py): sliding window, logit softcap and
attention sinks on step 9's loop, at step 9's launch for the head dim (its tiles and
hints from the platform table), with only the variants asked for compiled in. It also
runs the head dims step 9's code pads (``tile_head_dim``: D 80, 96, 192, value's head dim
not query's), with or without a variant.
"""

from dataclasses import dataclass

import cuda.tile as ct
import torch

from ..kernels import variants as kernels
from ..platforms import PlatformEntry
from .definitions import QUERY_TILE_STEP, STEPS
from .family import FORWARD_VARIANTS, UNUSED_ARRAY, forward_constants
from .launcher import (current_stream, head_group_views, on_device, sinks_argument,
                       split_head_dim, tile_head_dim, with_hints)



@dataclass(frozen=True)
class Variants:
    """What a call asks for beyond plain attention. window: (left, right) keys around the
    diagonal, each None for unbounded, or None for no window; softcap: the cap, or None;
    sinks: whether a per-head sink logit is given."""
    window: tuple[int | None, int | None] | None = None
    softcap: float | None = None
    sinks: bool = False

    @property
    def any(self) -> bool:
        """Whether a variant is asked for (a property, not __bool__: dynamo traces
        attribute reads, not the truth of a dataclass)."""
        return self.window is not None or self.softcap is not None or self.sinks

    def constants(self) -> dict:
        return {"SOFTCAP": self.softcap is not None, "WINDOW": self.window is not None,
                "SINKS": self.sinks}

    def operator_arguments(self) -> tuple[int, int, float]:
        """(window_left, window_right, softcap) as the custom operators take them: sides
        NO_WINDOW for no window and -1 for unbounded, softcap 0.0 for none (their schema
        has no optional tuple); with the sinks tensor, ``of_operator_arguments`` undoes it."""
        if self.window is None:
            left = right = NO_WINDOW
        else:
            left, right = (-1 if side is None else side for side in self.window)
        return left, right, self.softcap or 0.0

    @classmethod
    def of_operator_arguments(cls, window_left: int, window_right: int, softcap: float,
                              sinks) -> "Variants":
        window = None if window_left == NO_WINDOW else \
            tuple(None if side == -1 else side for side in (window_left, window_right))
        return cls(window=window, softcap=softcap or None, sinks=sinks is not None)

    def scalars(self, *, q_rows: int, k_rows: int, causal: bool) -> dict:
        """The kernels' run-time scalars of the variants (placeholders where off); a
        window side of None, or wider than every row of q_rows queries and k_rows keys,
        reaches past them all (so it fits the kernels' int32)."""
        reach = q_rows + k_rows
        left, right = (min(reach, reach if side is None else side)
                       for side in self.window or (None, None))
        return {"softcap": self.softcap or 1.0, "window_left": left,
                "window_right": 0 if causal else right}

    def values(self, *, q_rows: int, k_rows: int, causal: bool, sinks) -> dict:
        """``scalars`` and the Sinks argument (UNUSED_ARRAY without sinks)."""
        return {"Sinks": sinks_argument(sinks),
                **self.scalars(q_rows=q_rows, k_rows=k_rows, causal=causal)}


NO_VARIANTS = Variants()
NO_WINDOW = -2  # operator_arguments' window side for no window


def sinks_gradient(sinks: torch.Tensor | None, lse: torch.Tensor,
                   delta: torch.Tensor) -> torch.Tensor:
    """d loss / d sinks, in sinks' dtype (None: an empty float32 tensor): a sink is a logit
    whose value is 0, so its softmax weight P_sink = exp(sink - lse) gets
    dS = P_sink * (0 - Delta), summed over every row of its head. lse (batch rows, heads,
    rows) holds the sinks' terms; delta: the backward's rowsum(dO * O), of that shape."""
    if sinks is None:
        return lse.new_empty(0)
    return -(torch.exp(sinks.float()[None, :, None] - lse) * delta).sum((0, 2)).to(sinks.dtype)


def variants_kernel(entry: PlatformEntry, *, head_dim: int, causal: bool, query_group: int,
                    write_lse: bool, variants: Variants,
                    value_head_dim: int | None = None) -> tuple[object, dict]:
    """(kernel with step 9's hints, compile-time constants) at `entry`'s step 9 launch for
    the wider tile width of Q's and K's head dim and V's (default head_dim): Q's and K's
    columns as ``split_head_dim`` cuts them, V's padded by ``tile_head_dim``."""
    value_tile = tile_head_dim(value_head_dim or head_dim)
    tiles, hints = STEPS[QUERY_TILE_STEP].launch_config(
        entry, native=True, head_dim=max(tile_head_dim(head_dim), value_tile), causal=causal)
    tile_d, tail = split_head_dim(head_dim)
    constants = forward_constants(tile_d, tiles, query_group=query_group, causal=causal,
                                  write_lse=write_lse, value_head_dim=value_tile,
                                  head_dim_tail=tail) | variants.constants()
    return with_hints(kernels.fmha, hints), constants


def variants_forward(q, k, v, *, query_offset: int | None, scale: float, with_lse: bool,
                     variants: Variants, sinks: torch.Tensor | None = None,
                     platform: PlatformEntry | None = None,
                     kv_heads_per_launch: int | None = None):
    """(out, lse or None) of q (batch, heads, q_len, D) against k (batch, kv_heads, k_len,
    D), v (batch, kv_heads, k_len, D_v) with `variants`: out (batch, heads, q_len, D_v);
    query_offset: the causal diagonal's (None: not causal; the window is then aligned
    top-left). sinks: (heads,) when variants.sinks. kv_heads_per_launch: for tensors past
    cuTile's 32-bit strides whole, the K/V heads each launch takes (with their query
    heads), per batch entry (``launcher.kv_heads_per_launch``); None: one launch.
    Arguments checked by the caller (cutile_fmha.dropin)."""
    causal = query_offset is not None
    shape = dict(head_dim=q.shape[-1], value_head_dim=v.shape[-1],
                 causal=causal, query_group=q.shape[1] // k.shape[1],
                 write_lse=with_lse, variants=variants)
    kernel, constants = variants_kernel(platform, **shape) if platform else \
        on_device(variants_kernel, q.device, **shape)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32) if with_lse else None
    values = {"Q": q, "K": k, "V": v, "Out": out,
              "Lse": lse if with_lse else UNUSED_ARRAY, "qk_scale": scale,
              "query_offset": query_offset or 0, **constants,
              **variants.values(q_rows=q.shape[2], k_rows=k.shape[2], causal=causal,
                                sinks=sinks)}
    for group in head_group_views(values, kv_heads_per_launch, k.shape[1], shape["query_group"],
                                  key_side=("K", "V")):
        ct.launch(current_stream(q.device), FORWARD_VARIANTS.grid(group), kernel,
                  FORWARD_VARIANTS.arguments(group))
    return out, lse
