"""Probe: a paged cache's block read for all its K/V heads at once.

A block of a paged cache (blocks, BLOCK_SIZE, kv_heads, D) holds BLOCK_SIZE x kv_heads
rows of D elements, contiguous. The package's decode kernel runs a CTA per K/V head and
joins a 128-key tile from 128 / BLOCK_SIZE TMA loads (Hopper's TMA has no gather). Here a
CTA takes HEADS K/V heads: each loop trip is one paged block, one TMA load of its
(BLOCK_SIZE, HEADS, D) rows viewed as BLOCK_SIZE * HEADS rows of the products' M side,
against the query heads of all HEADS K/V heads as columns; the products between a row and
a column of different K/V heads are masked out (-inf scores, zero weights). The tensor
cores do HEADS times the useful work, which decode, bound by memory, leaves idle anyway.
q_len 1, no variants, keys from 0, lengths per sequence.
"""
import math

import cuda.tile as ct

from cutile_fmha.kernels.common import ConstBool, ConstInt, INV_LOG_2, LN_2
from cutile_fmha.kernels.decode import normalized
from cutile_fmha.kernels.step9_unmasked_loop import block_of

ZERO = ct.PaddingMode.ZERO


def block_rows(Cache, BlockTable, batch, head_tile, j, BLOCK_SIZE: ConstInt, HEADS: ConstInt,
               TILE_D: ConstInt):
    """Block j of sequence `batch`, K/V heads head_tile * HEADS on: (BLOCK_SIZE * HEADS,
    TILE_D), row r is key r // HEADS of head r % HEADS."""
    block = block_of(Cache, BlockTable, batch, j)
    return ct.load(Cache, index=(block, 0, head_tile, 0), shape=(1, BLOCK_SIZE, HEADS, TILE_D),
                   padding_mode=ZERO, latency=4).reshape((BLOCK_SIZE * HEADS, TILE_D))


def trips(K, V, BlockTable, q_t, same_head, m, l, acc, lo, hi, batch, head_tile, end,
          qk_scale_log2, BLOCK_SIZE: ConstInt, HEADS: ConstInt, TILE_D: ConstInt,
          MASKED: ConstBool):
    rows = BLOCK_SIZE * HEADS
    columns = q_t.shape[1]
    for j in range(lo, hi):
        k = block_rows(K, BlockTable, batch, head_tile, j, BLOCK_SIZE, HEADS, TILE_D)
        s = ct.mma(k, q_t, ct.full((rows, columns), 0.0, dtype=ct.float32))
        visible = same_head
        if MASKED:
            keys = (j * BLOCK_SIZE + ct.arange(rows, dtype=ct.int32) // HEADS)[:, None]
            in_sequence = keys < end
            visible = visible & in_sequence
        s = ct.where(visible, s, -math.inf)
        m_new = ct.maximum(m, ct.max(s, axis=0, keepdims=True) * qk_scale_log2)
        m_used = ct.where(m_new == -math.inf, 0.0, m_new)
        p = ct.exp2(s * qk_scale_log2 - m_used, flush_to_zero=True)
        alpha = ct.exp2(m - m_used, flush_to_zero=True)
        l = l * alpha + ct.sum(p, axis=0, keepdims=True)
        v = block_rows(V, BlockTable, batch, head_tile, j, BLOCK_SIZE, HEADS, TILE_D)
        if MASKED:
            v = ct.where(in_sequence, v, 0.0)
        acc = ct.mma(ct.transpose(v), p.astype(v.dtype), acc * alpha)
        m = m_new
    return m, l, acc


@ct.kernel
def decode_block_heads(Q, K, V, Out, Lse, Partial, PartialLse, KeyEnds, BlockTable,
                       qk_scale: float, TILE_D: ConstInt, BLOCK_SIZE: ConstInt,
                       HEADS: ConstInt, QUERY_GROUP: ConstInt, COLUMNS: ConstInt,
                       SPLIT: ConstBool, WRITE_LSE: ConstBool):
    """Q (batch, heads, 1, D); K, V (blocks, BLOCK_SIZE, kv_heads, D); grid (splits,
    kv_heads / HEADS, batch); Partial (batch, kv_heads / HEADS, splits, COLUMNS, D) and
    PartialLse float32 under SPLIT, else Out and Lse written. Column c is query head
    head_tile * HEADS * QUERY_GROUP + c."""
    split, head_tile, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if SPLIT:
        ct.grid_dependency_control_launch_dependents()
    splits = ct.num_blocks(0)
    capacity = BlockTable.shape[1] * BLOCK_SIZE
    end = min(max(ct.gather(KeyEnds, batch), 0), capacity)
    column = ct.arange(COLUMNS, dtype=ct.int32)
    is_query = (column < HEADS * QUERY_GROUP)[:, None]
    head = (head_tile * HEADS * QUERY_GROUP + column)[:, None]
    dims = ct.arange(TILE_D, dtype=ct.int32)[None, :]
    q = ct.gather(Q, (batch, head, 0, dims), mask=is_query)
    q_t = ct.transpose(q)
    rows = BLOCK_SIZE * HEADS
    same_head = (ct.arange(rows, dtype=ct.int32) % HEADS)[:, None] == \
        (column // QUERY_GROUP)[None, :]

    num_tiles = ct.cdiv(end, BLOCK_SIZE)
    per_split = ct.cdiv(num_tiles, splits)
    lo = min(split * per_split, num_tiles)
    hi = min((split + 1) * per_split, num_tiles)
    whole_hi = max(min(end // BLOCK_SIZE, hi), lo)
    qk_scale_log2 = qk_scale * INV_LOG_2
    m = ct.full((1, COLUMNS), -math.inf, dtype=ct.float32)
    l = ct.full((1, COLUMNS), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_D, COLUMNS), 0.0, dtype=ct.float32)
    shared = (K, V, BlockTable, q_t, same_head)
    where = (batch, head_tile, end, qk_scale_log2, BLOCK_SIZE, HEADS, TILE_D)
    m, l, acc = trips(*shared, m, l, acc, lo, whole_hi, *where, False)
    m, l, acc = trips(*shared, m, l, acc, whole_hi, hi, *where, True)
    out, lse_log2 = normalized(m, l, acc)
    out = ct.transpose(out)
    if SPLIT:
        ct.store(Partial, index=(batch, head_tile, split, 0, 0),
                 tile=out.reshape((1, 1, 1, COLUMNS, TILE_D)))
        ct.store(PartialLse, index=(batch, head_tile, split, 0),
                 tile=lse_log2.reshape((1, 1, 1, COLUMNS)))
    else:
        ct.scatter(Out, (batch, head, 0, dims), out.astype(Out.dtype), mask=is_query)
        if WRITE_LSE:
            ct.scatter(Lse, (batch, head, 0), (lse_log2 * LN_2).reshape((COLUMNS, 1)),
                       mask=is_query)


# The probe's arguments, described as the package's families are (steps/family.py).
def block_heads_family():
    from cutile_fmha.steps.family import (
        KernelFamily, Scalar, Constant, Tensor, _QKV, _OUTPUTS_AND_PARTIALS)
    return KernelFamily(
        name="decode_block_heads",
        parameters=_QKV + _OUTPUTS_AND_PARTIALS
        + (Tensor("KeyEnds", 1, ct.int32, aligned=False),
           Tensor("BlockTable", 2, ct.int32, aligned=False), Scalar("qk_scale", ct.float32))
        + tuple(Constant(name) for name in ("TILE_D", "BLOCK_SIZE", "HEADS", "QUERY_GROUP",
                                            "COLUMNS", "SPLIT", "WRITE_LSE")),
        grid=lambda values: (values["splits"], values["kv_heads"] // values["HEADS"],
                             values["batch"]))
