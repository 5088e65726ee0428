"""Context-parallel (ring) attention over torch.distributed: one long sequence across ranks.

    import torch.distributed as dist
    from cutile_fmha.distributed import ring_attention, zigzag_shard, zigzag_unshard

    q, k, v = (zigzag_shard(t, rank, world_size) for t in (query, key, value))  # (B, H, N/W, D)
    out = ring_attention(q, k, v, is_causal=True)        # this rank's rows of the output
    full = zigzag_unshard(gathered_outs)                  # from every rank's, in rank order

Each rank holds 2·W-th chunks of the sequence's Q, K and V (W ranks): chunk r and chunk
2W-1-r ("zigzag"), so that under a causal mask every rank has the same work. The K/V
shards travel around the ring (P2P sends to the next rank, receives from the previous,
through ``torch.distributed.batch_isend_irecv``), each arriving while the local kernel
works on the one before; each rank merges its partial outputs with their log-sum-exps.
The backward recomputes each block's probabilities from the global LSE and sends each K/V
block's dK/dV accumulator around the ring with it, back to its owner.

With the zigzag layout, a rank's step against the shard of rank `src` is (c = N / 2W):
- src == rank: its own two chunks, causal (the local concatenation keeps their order);
- src < rank: both its query chunks against src's first chunk, every key seen;
- src > rank: its second query chunk against both of src's chunks, every key seen;
so each step is 2c² query-key pairs. Without the mask every step is full attention.

The local attention is pluggable (``LocalAttention``): the cuTile kernels by default
(``attention_with_lse``'s forward and ``attention_backward``), or plain PyTorch
(``TORCH_LOCAL``, the float64 reference), which runs on a CPU with the gloo backend (the
tests' stand-in).
"""

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from .steps.reference import reference, reference_backward

__all__ = ["ring_attention", "zigzag_shard", "zigzag_unshard", "merge_partials",
           "LocalAttention", "TORCH_LOCAL", "CUTILE_LOCAL"]

@dataclass(frozen=True)
class LocalAttention:
    """One rank's attention of (B, H, Nq, D) queries to (B, Hkv, Nk, D) keys and values.
    forward(q, k, v, causal, scale) -> (out, lse float32 (B, H, Nq)); backward(q, k, v, out,
    lse, grad_out, causal, scale) -> (dq, dk, dv), where out and lse may be the merged
    (global) ones: the probabilities are rebuilt from lse, and Delta from out."""
    forward: Callable
    backward: Callable


def _reference_forward(q, k, v, causal: bool, scale: float):
    out, lse = reference(q, k, v, causal=causal, scale=scale)
    return out.to(q.dtype), lse.float()


def _reference_backward(q, k, v, out, lse, grad_out, causal: bool, scale: float):
    return reference_backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale)


# The float64 reference (steps/reference.py): any device, gloo included.
TORCH_LOCAL = LocalAttention(_reference_forward, _reference_backward)


def _cutile_forward(q, k, v, causal: bool, scale: float):
    from .dropin import CAUSAL_NAMES, forward_launch
    with torch.no_grad():
        return forward_launch(q, k, v, CAUSAL_NAMES[causal], scale, True)


def _cutile_backward(q, k, v, out, lse, grad_out, causal: bool, scale: float):
    from .steps.backward import attention_backward
    return attention_backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale)


# The cuTile kernels: the forward with its LSE, the backward (D 64/128/256).
CUTILE_LOCAL = LocalAttention(_cutile_forward, _cutile_backward)


def zigzag_shard(x: torch.Tensor, rank: int, world_size: int, dim: int = 2) -> torch.Tensor:
    """Rank `rank`'s shard of `x` along `dim` (the sequence): of its 2·world_size equal
    chunks, chunk rank and chunk 2·world_size-1-rank, concatenated (contiguous)."""
    _check_world(rank, world_size)
    length = x.shape[dim]
    if length % (2 * world_size):
        raise ValueError(f"the sequence length (dimension {dim}, {length}) must be divisible "
                         f"by 2 x world_size = {2 * world_size}: each rank holds two equal "
                         f"chunks")
    chunks = x.chunk(2 * world_size, dim)
    return torch.cat([chunks[rank], chunks[2 * world_size - 1 - rank]], dim).contiguous()


def zigzag_unshard(shards: list[torch.Tensor], dim: int = 2) -> torch.Tensor:
    """The full sequence from every rank's ``zigzag_shard``, in rank order."""
    if not shards or any(s.shape != shards[0].shape for s in shards):
        raise ValueError(f"shards must be one per rank, all of one shape, got shapes "
                         f"{[tuple(s.shape) for s in shards]}")
    world_size = len(shards)
    if shards[0].shape[dim] % 2:
        raise ValueError(f"a zigzag shard holds two equal chunks along dimension {dim}, got "
                         f"length {shards[0].shape[dim]}")
    halves = [s.chunk(2, dim) for s in shards]
    ordered = [halves[r][0] for r in range(world_size)] + \
        [halves[r][1] for r in reversed(range(world_size))]
    return torch.cat(ordered, dim)


def merge_partials(out: torch.Tensor, lse: torch.Tensor, block_out: torch.Tensor,
                   block_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two attentions of the same queries to disjoint key sets, as one: merges a block's
    (block_out, block_lse) into out (float32 or float64) and lse (-inf for rows that saw
    nothing yet) in place, views of larger tensors included, and returns them; rows that
    see nothing in either stay 0 and -inf."""
    new_lse = torch.logaddexp(lse, block_lse)
    # Rows still at -inf take 0 as their reference, so that both their weights are exp(-inf).
    reference = new_lse.nan_to_num(neginf=0.0)
    out.mul_(torch.exp(lse - reference)[..., None])
    out.addcmul_(block_out, torch.exp(block_lse - reference)[..., None])
    lse.copy_(new_lse)
    return out, lse


def _accumulator_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision shards, float64 for float64 ones (the reference's)."""
    return torch.promote_types(x.dtype, torch.float32)


def _check_world(rank: int, world_size: int) -> None:
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int)
            and 0 <= rank < world_size):
        raise ValueError(f"rank must be in [0, world_size), got rank {rank!r}, world_size "
                         f"{world_size!r}")


def _check(q, k, v, world_size: int) -> None:
    for name, t in (("query", q), ("key", k), ("value", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be this rank's shard, (batch, heads, shard length, "
                             f"D), got {getattr(t, 'shape', type(t).__name__)}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"key and value must be one shape, with query's batch and head dim, "
                         f"got query {tuple(q.shape)}, key {tuple(k.shape)}, value "
                         f"{tuple(v.shape)}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"query's heads must be a multiple of key's (grouped-query "
                         f"attention), got {q.shape[1]} and {k.shape[1]}")
    if q.shape[2] != k.shape[2] or q.shape[2] % 2 or q.shape[2] == 0:
        raise ValueError(f"query, key and value shards must be zigzag_shard's: one even, "
                         f"non-zero length (two equal chunks of one sequence), got "
                         f"{q.shape[2]} query and {k.shape[2]} key rows")


# (group, the local shapes) already found equal on every rank of the group.
_SAME_ON_EVERY_RANK: set[tuple] = set()


def _check_ranks_agree(q, k, v, group) -> None:
    """A clear error on every rank where the ranks' shards differ in shape or dtype (P2P
    transfers of mismatched buffers would fail or hang), looked up across the ranks once per
    group and local shapes (a host synchronisation then, none after)."""
    local = (tuple(q.shape), tuple(k.shape), tuple(v.shape), str(q.dtype))
    key = (id(group), local)
    if key in _SAME_ON_EVERY_RANK:
        return
    every = [None] * dist.get_world_size(group)
    dist.all_gather_object(every, local, group=group)
    if any(shapes != local for shapes in every):
        listed = "; ".join(f"rank {r}: query {s[0]}, key {s[1]}, {s[3]}"
                           for r, s in enumerate(every))
        raise ValueError(f"every rank must pass shards of one shape and dtype (zigzag_shard of "
                         f"one sequence), got {listed}")
    _SAME_ON_EVERY_RANK.add(key)


def _ring_exchange(tensors: list[torch.Tensor], group, rank: int, world_size: int):
    """Starts sending `tensors` to the next rank and receiving as many from the previous
    one; returns (the receive buffers, the requests to wait on). Alone in the ring, what
    it would send is what it receives."""
    if world_size == 1:
        return list(tensors), []
    received = [torch.empty_like(t) for t in tensors]
    to_next = dist.get_global_rank(group, (rank + 1) % world_size) if group else \
        (rank + 1) % world_size
    from_previous = dist.get_global_rank(group, (rank - 1) % world_size) if group else \
        (rank - 1) % world_size
    ops = [dist.P2POp(dist.isend, t, to_next, group) for t in tensors] + \
        [dist.P2POp(dist.irecv, t, from_previous, group) for t in received]
    return received, dist.batch_isend_irecv(ops)


def _step_blocks(rank: int, source: int, causal: bool, length: int):
    """(query rows, key rows, causal) of this rank's step against `source`'s shard, as
    slices of the local rows (see the module's docstring), or None where it sees none."""
    half = length // 2
    every = slice(0, length)
    if not causal:
        return every, every, False
    if source == rank:
        return every, every, True
    if source < rank:
        return every, slice(0, half), False
    return slice(half, length), every, False


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, local):
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        block = [k.contiguous(), v.contiguous()]  # what P2P sends must be contiguous
        for step in range(world_size):
            requests = []
            if step < world_size - 1:  # the next block arrives while this one computes
                incoming, requests = _ring_exchange(block, group, rank, world_size)
            rows, keys, block_causal = _step_blocks(rank, (rank - step) % world_size, causal,
                                                    q.shape[2])
            block_out, block_lse = local.forward(q[:, :, rows], block[0][:, :, keys],
                                                 block[1][:, :, keys], block_causal, scale)
            if step == 0:  # this rank's own block: every row, nothing to merge with yet
                out = block_out.to(_accumulator_dtype(q))
                lse = block_lse.to(_accumulator_dtype(q))
            else:
                merge_partials(out[:, :, rows], lse[:, :, rows], block_out, block_lse)
            for request in requests:
                request.wait()
            if requests:
                block = incoming
        out, lse = out.to(q.dtype), lse.float()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.scale, ctx.local = group, causal, scale, local
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale, local = ctx.group, ctx.causal, ctx.scale, ctx.local
        rank, world_size = dist.get_rank(group), dist.get_world_size(group)
        grad_out = grad_out.contiguous()
        block = [k.contiguous(), v.contiguous()]
        # (the dK/dV accumulator of the block this rank holds, on its way from the previous
        # rank; the requests to wait on before reading it)
        accumulator, arriving = None, []
        for step in range(world_size):
            requests = []
            if step < world_size - 1:
                incoming, requests = _ring_exchange(block, group, rank, world_size)
            rows, keys, block_causal = _step_blocks(rank, (rank - step) % world_size, causal,
                                                    q.shape[2])
            block_dq, block_dk, block_dv = local.backward(
                q[:, :, rows], block[0][:, :, keys], block[1][:, :, keys], out[:, :, rows],
                lse[:, :, rows].contiguous(), grad_out[:, :, rows], block_causal, scale)
            if step == 0:  # this rank's own block: every row and key
                dq = block_dq.to(_accumulator_dtype(q))
                accumulator = torch.stack((block_dk, block_dv)).to(_accumulator_dtype(k))
            else:
                dq[:, :, rows] += block_dq
                for request in arriving:
                    request.wait()
                accumulator[0][:, :, keys] += block_dk
                accumulator[1][:, :, keys] += block_dv
            # On to the next rank, which holds this block next, or after the last step owns
            # it: that hop carries the finished sum in k's dtype (the owner's cast, made by
            # the sender: the same numbers in half of float32's bytes, and this transfer is
            # the one no computation hides). The requests keep what is sent alive until
            # they are waited on.
            if step == world_size - 1:
                accumulator = accumulator.to(k.dtype)
            (accumulator,), arriving = _ring_exchange([accumulator], group, rank, world_size)
            for request in requests:
                request.wait()
            if requests:
                block = incoming
        for request in arriving:
            request.wait()
        dk, dv = accumulator
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                   group=None, is_causal: bool = False, scale: float | None = None,
                   return_lse: bool = False, local: LocalAttention | None = None):
    """Attention of one sequence sharded across the ranks of `group` (default: the world),
    each rank passing its ``zigzag_shard`` of query (B, H, N/W, D), key and value (B, Hkv,
    N/W, D); returns this rank's rows of the output (its zigzag shard of the full
    attention's), and with return_lse their log-sum-exp (float32 (B, H, N/W)).

    is_causal: the causal mask of the full sequence (SDPA's). scale: default 1/sqrt(D).
    local: the per-rank attention, the cuTile kernels (CUTILE_LOCAL) by default. The
    sequence length must be divisible by 2 x world_size (zigzag_shard checks it); every
    rank must pass shards of one shape and dtype (checked across the ranks the first time
    a shape is seen: a ValueError on every rank). Differentiable in query, key and value (the
    backward sends dK/dV around the ring); the LSE is not.
    """
    if not dist.is_initialized():
        raise RuntimeError("ring_attention needs torch.distributed initialised "
                           "(dist.init_process_group), one process per rank")
    _check(query, key, value, dist.get_world_size(group))
    _check_ranks_agree(query, key, value, group)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if scale is None:
        scale = query.shape[-1] ** -0.5
    out, lse = _RingAttention.apply(query, key, value, group, is_causal, float(scale),
                                    local or CUTILE_LOCAL)
    return (out, lse) if return_lse else out
