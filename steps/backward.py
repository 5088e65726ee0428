"""The backward pass's launcher: dQ, dK, dV from the forward's inputs, output and LSE.

Two launches (kernels/backward.py): dQ (one CTA per query tile), which also writes Delta
= rowsum(O * dO), then dK/dV (one CTA per key tile of a K/V head), which reads it; or,
where the platform's "dkdv_dq" launch pays (platforms/backward.py), Delta (``row_dot``)
and dK/dV adding dQ to a zeroed float32 buffer with atomics, which is then cast into dQ;
without the causal mask and with many query rows, that launch runs once per chunk of
queries (``query_chunk_rows``). The forward must have written the LSE (``plan_launch(...,
with_lse=True)``); the backward rebuilds P from it.
"""

import dataclasses

import cuda.tile as ct
import torch

from ..kernels import backward as kernels
from ..platforms import HEAD_DIMS
from ..platforms.backward import BackwardEntry, BackwardLaunch, backward_entry_for
from ..platforms.entry import launch_head_dim
from .family import DKDV, DQ, ROW_DOT, UNUSED_ARRAY, backward_constants
from .launcher import (causal_query_offset, device_facts, head_group_views,
                       heads_per_launch, kv_heads_per_launch, rows_contiguous,
                       softmax_scale, split_head_dim, tile_head_dim, with_hints)
from .variants import NO_VARIANTS, Variants

# row_dot's query rows per CTA, a tile of about this many elements (64 to 256 rows): on
# an H100, 128 rows ran in 0.82x the time of 64 at D=128 (256 no faster), 256 rows in
# 0.57x at D=64 (docs/performance.md).
ROW_DOT_TILE_ELEMENTS = 128 * 128


def row_dot_tile_m(tile_d: int) -> int:
    return min(max(ROW_DOT_TILE_ELEMENTS // tile_d, 64), 256)


# The kernel of each backward launch: "dkdv_dq" is dK/dV's with ATOMIC_DQ on.
KERNEL_OF_LAUNCH = {"dkdv": "dkdv", "dq": "dq", "dkdv_dq": "dkdv"}


def backward_kernel(name: str, num_worker_warps: int | None, module=kernels):
    """The kernel of the named backward launch ("dkdv", "dq" or "dkdv_dq") of `module`
    (the dense ones, or kernels/varlen.py's) with its worker-warps hint."""
    hints = None if num_worker_warps is None else {"num_worker_warps": num_worker_warps}
    return with_hints(getattr(module, KERNEL_OF_LAUNCH[name]), hints)


BACKWARD_FAMILIES = {"dkdv": DKDV, "dq": DQ, "dkdv_dq": DKDV}
KEY_SIDE = ("K", "V", "dK", "dV")  # the backward's tensors with K/V heads


def check_backward_head_dims(q_head_dim: int, v_head_dim: int) -> None:
    """Query/key's and value's head dims up to HEAD_DIMS[-1] (``tile_head_dim`` pads)."""
    if max(q_head_dim, v_head_dim) > HEAD_DIMS[-1]:
        raise ValueError(f"the backward runs head dims up to {HEAD_DIMS[-1]}, got "
                         f"{q_head_dim} (value: {v_head_dim}): past {HEAD_DIMS[-1]} only the "
                         f"forward (steps 10-11) is built")


def row_dot(out: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """Delta = rowsum(out * grad_out), float32 (batch, heads, q_len); past cuTile's 32-bit
    strides whole, by groups of heads (``heads_per_launch``)."""
    delta = out.new_empty(out.shape[:-1], dtype=torch.float32)
    tile_d = tile_head_dim(out.shape[-1])
    values = {"Out": out, "dOut": grad_out, "Delta": delta, "TILE_M": row_dot_tile_m(tile_d),
              "TILE_D": tile_d}
    per_launch = heads_per_launch([(out, 1), (grad_out, 1)], out.shape[1])
    for group in head_group_views(values, per_launch, out.shape[1]):
        ct.launch(torch.cuda.current_stream(out.device), ROW_DOT.grid(group), kernels.row_dot,
                  ROW_DOT.arguments(group))
    return delta


def gradient_launch(entry: BackwardEntry, name: str, q_head_dim: int, v_head_dim: int, *,
                    query_group: int, causal: bool, variants: Variants = NO_VARIANTS,
                    add_to_dkdv: bool = False, delta_from_out: bool = False):
    """(launch, constants) of the "dkdv", "dq" or "dkdv_dq" launch at these head dims
    (``launches_for``; at its softcap tiles under a softcap), Q's and K's columns in the
    forward's tiles for the launch's split_head_dims (``split_head_dim``: D=96 as 64 + 32,
    not padded to 128) and padded for the others, V's padded (``tile_head_dim``);
    `add_to_dkdv`: the dK/dV kernel adds to the float32 dK and dV it is handed;
    `delta_from_out`: the dQ kernel writes Delta from Out and dO."""
    launch = launches_for(entry, q_head_dim, v_head_dim)[name]
    if variants.softcap is not None and launch.softcap_tiles is not None:
        launch = dataclasses.replace(launch, tiles=launch.softcap_tiles)
    head_dim, tail = query_columns(launch, q_head_dim)
    return launch, backward_constants(head_dim, launch.tiles, query_group=query_group,
                                      causal=causal, variants=variants,
                                      value_head_dim=tile_head_dim(v_head_dim),
                                      head_dim_tail=tail, atomic_dq=name == "dkdv_dq",
                                      add_to_dkdv=add_to_dkdv,
                                      dq_late=name == "dkdv_dq" and launch.dq_late,
                                      delta_from_out=delta_from_out)


def launches_for(entry: BackwardEntry, q_head_dim: int, v_head_dim: int) -> dict:
    """Kernel -> launch at these head dims: `entry`'s for the wider tile width
    (``launch_head_dim``), with its exact_launches for these two head dims over them (a
    new dict only then: the backward asks on every call)."""
    launches = entry.launches[launch_head_dim(q_head_dim, v_head_dim)]
    exact = entry.exact_launches.get((q_head_dim, v_head_dim))
    return launches if exact is None else launches | exact


def query_columns(launch: BackwardLaunch, q_head_dim: int) -> tuple[int, int]:
    """(TILE_D, TILE_D_TAIL) of Q's and K's columns in `launch`: the forward's split for
    its split_head_dims, else padded."""
    if q_head_dim in launch.split_head_dims:
        return split_head_dim(q_head_dim)
    return tile_head_dim(q_head_dim), 0


def splits_columns(launch: BackwardLaunch, q_head_dim: int) -> bool:
    """Whether `launch` runs Q's and K's columns at this head dim as two tiles
    (``query_columns``), not padded."""
    return query_columns(launch, q_head_dim)[1] > 0


def adds_dq_atomically(entry: BackwardEntry, q_head_dim: int, v_head_dim: int,
                       query_group: int, variants: Variants, *, causal: bool,
                       varlen: bool) -> bool:
    """Whether the call runs "dkdv_dq" alone: `entry` has it at this head dim, for every
    call, or for one with what its ``only_with`` names (a softcap, a window, split
    columns, no causal mask, a variable-length batch) or with at most its
    ``up_to_query_group`` query heads to a K/V head; and deterministic algorithms are off
    (its atomics add in whatever order the CTAs reach them)."""
    launch = launches_for(entry, q_head_dim, v_head_dim).get("dkdv_dq")
    if launch is None or torch.are_deterministic_algorithms_enabled():
        return False
    if launch.only_with is None or query_group <= launch.up_to_query_group:
        return True
    has = {"softcap": variants.softcap is not None, "window": variants.window is not None,
           "split": splits_columns(launch, q_head_dim), "non-causal": not causal,
           "varlen": varlen}
    return any(has[feature] for feature in launch.only_with)


def query_chunk_rows(launch: BackwardLaunch, q_head_dim: int, q_len: int, query_group: int,
                     causal: bool, variants: Variants, varlen: bool) -> int | None:
    """Query rows per launch where the one-kernel backward ("dkdv_dq" at `launch`) of this
    call runs its queries in chunks (``BackwardLaunch.chunk_query_rows`` per K/V head, over
    its query group), else None: only without the causal mask, a window or a packed batch,
    whose rows do not move with a chunk's start, and on Q's and K's columns padded, not
    split (80 and 96 as 64 + 16 and 64 + 32 did not slow down at long N in one launch, as
    D=64 did not). Each dK/dV CTA's loop runs over every query tile; at D=112 and 128 past
    about 64k rows a K/V head's CTAs stop finding the rows they share (Q, dO and the
    float32 dQ they add to) in the L2 (docs/performance.md)."""
    rows = launch.chunk_query_rows
    if rows is None or causal or varlen or variants.window is not None \
            or splits_columns(launch, q_head_dim) or q_len * query_group < 4 * rows:
        return None
    return max(rows // query_group // 128 * 128, 128)  # whole query tiles


def launch_gradient_kernels(families: dict, tensors: dict, *, causal: bool,
                            grid_values: dict | None = None, module=kernels,
                            entry: BackwardEntry | None = None,
                            variants: Variants = NO_VARIANTS, varlen: bool = False) -> None:
    """Writes tensors["dK"], ["dV"] and ["dQ"] with the launches of `families` (name ->
    family: "dkdv", "dq", "dkdv_dq") and `module`'s kernels: arguments from `tensors` by
    parameter name, tiles and hints from the backward's platform data for this GPU (or
    `entry`: the autotuner's candidates), the softcap and the window of `variants` compiled
    in; `grid_values` adds what only the grids read. tensors["Delta"] is None unless the
    caller made it (``row_dot``). Where `entry`'s "dkdv_dq" launch is for this call
    (``adds_dq_atomically``), it runs alone after ``row_dot``, adding dQ to a zeroed float32
    buffer that is then cast into dQ, once per chunk of queries where ``query_chunk_rows``
    says so (the kernel adding each chunk's dK/dV to float32 sums, ADD_TO_DKDV); else "dq"
    (writing Delta from tensors["Out"] where it is None: DELTA_FROM_OUT) and then "dkdv".
    The atomics add in whatever order the CTAs reach them, so dQ may differ in its last
    bits from run to run: under ``torch.use_deterministic_algorithms(True)`` the two
    kernels run."""
    q, k, v = tensors["Q"], tensors["K"], tensors["V"]
    query_group = q.shape[1] // k.shape[1]
    entry = entry or backward_entry_for(device_facts(q.device)[0])
    tensors = tensors | variants.scalars(q_rows=q.shape[2], k_rows=k.shape[2], causal=causal) \
        | {"dQAcc": UNUSED_ARRAY}
    names, dq_acc = ("dq", "dkdv"), None
    atomic = adds_dq_atomically(entry, q.shape[-1], v.shape[-1], query_group, variants,
                                causal=causal, varlen=varlen)
    if atomic:
        names, dq_acc = ("dkdv_dq",), torch.zeros_like(tensors["dQ"], dtype=torch.float32)
        tensors["dQAcc"] = dq_acc
    delta_from_out = tensors["Delta"] is None and not atomic
    if tensors["Delta"] is None:
        tensors["Delta"] = row_dot(tensors["Out"], tensors["dO"]) if atomic else \
            q.new_empty(q.shape[:-1], dtype=torch.float32)  # written by dQ
    if not delta_from_out:
        tensors["Out"] = UNUSED_ARRAY
    chunk = None if dq_acc is None else query_chunk_rows(
        launches_for(entry, q.shape[-1], v.shape[-1])["dkdv_dq"], q.shape[-1], q.shape[2],
        query_group, causal, variants, varlen)

    def run(name, tensors, add_to_dkdv=False):
        family = families[name]
        launch, constants = gradient_launch(entry, name, q.shape[-1], v.shape[-1],
                                            query_group=query_group, causal=causal,
                                            variants=variants, add_to_dkdv=add_to_dkdv,
                                            delta_from_out=delta_from_out)
        values = {key: tensors[key] for key in family.names if key in tensors} | constants
        ct.launch(torch.cuda.current_stream(q.device), family.grid(values | (grid_values or {})),
                  backward_kernel(name, launch.num_worker_warps, module),
                  family.arguments(values))

    if chunk is None:
        for name in names:
            run(name, tensors)
    else:  # the first chunk writes float32 dK/dV, the others add to them
        sums = {name: torch.empty_like(tensors[name], dtype=torch.float32)
                for name in ("dK", "dV")}
        for start in range(0, q.shape[2], chunk):
            rows = {name: tensors[name][:, :, start:start + chunk]
                    for name in ("Q", "dO", "Lse", "Delta", "dQAcc")}
            run("dkdv_dq", tensors | rows | sums, add_to_dkdv=start > 0)
        for name, total in sums.items():
            tensors[name].copy_(total)
    if dq_acc is not None:
        tensors["dQ"].copy_(dq_acc)


def attention_backward(q, k, v, out, lse, grad_out, *, causal: bool | str = False,
                       scale: float | None = None, entry: BackwardEntry | None = None,
                       variants: Variants = NO_VARIANTS, delta: torch.Tensor | None = None):
    """(dq, dk, dv) of ``out = attention(q, k, v, causal=causal, scale=scale)`` for the
    incoming gradient ``grad_out``; ``lse`` is the forward's (batch, heads, q_len) float32
    log-sum-exp. dk and dv have k's and v's shapes: with grouped-query heads each sums the
    gradients of the query heads that share it. `entry`: other launches than this GPU's
    (the autotuner's candidates). `variants`: the forward's (its softcap and window; with
    sinks the LSE holds their terms, and dq, dk, dv are the plain ones). `delta`: ``row_dot``
    of out and grad_out where the caller made it (the sinks' gradient needs it too; else
    the kernels make it). Past
    cuTile's 32-bit strides whole, by groups of heads (``kv_heads_per_launch``)."""
    batch, heads, q_len, head_dim = q.shape
    check_backward_head_dims(head_dim, v.shape[-1])
    if grad_out.shape != out.shape:
        raise ValueError(f"grad_out must have out's shape {tuple(out.shape)}, got "
                         f"{tuple(grad_out.shape)}")
    grad_out = rows_contiguous(grad_out.to(out.dtype))
    query_offset = causal_query_offset(causal, q_len, k.shape[2])
    scale = softmax_scale(scale, head_dim)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = {"Q": q, "K": k, "V": v, "dO": grad_out, "Lse": lse, "Out": out, "Delta": delta,
               "dK": dk, "dV": dv, "dQ": dq, "qk_scale": scale,
               "query_offset": query_offset or 0}
    for group in head_group_views(tensors, kv_heads_per_launch(q, k, v), k.shape[1],
                                  heads // k.shape[1], key_side=KEY_SIDE):
        launch_gradient_kernels(BACKWARD_FAMILIES, group, causal=query_offset is not None,
                                entry=entry, variants=variants)
    return dq, dk, dv
