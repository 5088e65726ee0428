"""Step 10: the head dimension tiled too, for head dims past 256 (FFPA's idea).

Steps 1-9 hold a (TILE_M x D) query tile and float32 accumulator on chip and load whole
(TILE_N x D) key and value tiles. Past D=256 that no longer fits: the registers spill, and
cuTile's tiles must be powers of two, which 320, 384, 448, ... are not. Here D is tiled:

- Q K^T is accumulated over TILE_K-wide column chunks of Q and K, loaded in a loop of
  their own: shared memory holds a few chunks in flight, whatever D is (FFPA's O(1) SRAM).
- P V is produced in output chunks, each its own accumulator, a power of two wide and at
  most 256 (the widest warpgroup MMA): 320 = 256 + 64, 384 = 256 + 128, ...
- A CTA computes TILE_V of the D output columns. With TILE_V = D one CTA per query tile
  computes them all; past what the registers hold (64 rows by about 700 float32
  columns), D / TILE_V CTAs share a query tile, each recomputing Q K^T for its own slice
  of the output: FLOPs traded for on-chip memory, as FFPA's recomputation level does.

With TILE_K = TILE_V = D (D up to 256) this is step 9, but for its query tile, which it
reloads chunk by chunk for every key tile.
"""

import math

import cuda.tile as ct

from ..platforms import occupancy_by_target, worker_warps_by_target
from .common import INV_LOG_2, LN_2, ConstBool, ConstInt

WIDEST_MMA = 256  # columns of the widest warpgroup MMA (wgmma's largest N)


def output_chunks(width: int) -> tuple[tuple[int, int], ...]:
    """(offset, width) of each accumulator of a `width`-column output slice: powers of two,
    widest first, so each offset is a multiple of its chunk's width (a tile index)."""
    chunks, offset = [], 0
    while offset < width:
        chunk = min(WIDEST_MMA, 1 << ((width - offset).bit_length() - 1))
        chunks.append((offset, chunk))
        offset += chunk
    return tuple(chunks)


def attend(Q, K, V, accs, m_i, l_i, first_tile, end_tile, batch, head, kv_head, q_tile,
           k_len, last_key, offs_n_in_tile, qk_scale_log2, TILE_D: ConstInt, TILE_M: ConstInt,
           TILE_N: ConstInt, TILE_K: ConstInt, TILE_V: ConstInt, CAUSAL: ConstBool,
           MASKED: ConstBool):
    """Key tiles first_tile..end_tile-1 into the running (accs, m_i, l_i); with MASKED, past
    the causal diagonal and the last key are masked. V is this CTA's slice of columns."""
    for j in range(first_tile, end_tile):
        qk = ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32)
        for chunk in range(TILE_D // TILE_K):
            q = ct.load(Q, index=(batch, head, q_tile, chunk), shape=(1, 1, TILE_M, TILE_K),
                        latency=2).reshape((TILE_M, TILE_K))
            k_t = ct.load(K, index=(batch, kv_head, chunk, j), shape=(1, 1, TILE_K, TILE_N),
                          order=(0, 1, 3, 2), latency=2).reshape((TILE_K, TILE_N))
            qk = ct.mma(q, k_t, qk)
        if MASKED:
            offs_n = j * TILE_N + offs_n_in_tile
            visible = offs_n < k_len
            if CAUSAL:
                visible = visible & (last_key >= offs_n)
            qk = ct.where(visible, qk, -math.inf)

        m_ij = ct.maximum(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
        p = ct.exp2(qk * qk_scale_log2 - m_ij, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # rescales the old sums
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        p = p.astype(V.dtype)

        updated = ()
        for index, (offset, width) in ct.static_iter(enumerate(output_chunks(TILE_V))):
            # Zero padding: rows past the last key must add 0 * 0, not 0 * garbage.
            v = ct.load(V, index=(batch, kv_head, j, offset // width),
                        shape=(1, 1, TILE_N, width), padding_mode=ct.PaddingMode.ZERO,
                        latency=4).reshape((TILE_N, width))
            updated += (ct.mma(p, v, accs[index] * alpha),)
        accs = updated
        m_i = m_ij
    return accs, m_i, l_i


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha(Q, K, V, Out, Lse, qk_scale: float, query_offset: int,
         TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool, TILE_K: ConstInt, TILE_V: ConstInt, WRITE_LSE: ConstBool):
    slices = TILE_D // TILE_V  # CTAs per query tile, each TILE_V output columns
    q_tile, out_slice = ct.bid(0) // slices, ct.bid(0) % slices
    head, batch = ct.bid(1), ct.bid(2)
    if CAUSAL:
        q_tile = ct.num_blocks(0) // slices - 1 - q_tile  # longest first
    attend_query_tile(Q, K, V, Out, Lse, batch, head, q_tile, out_slice, qk_scale,
                      query_offset, TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, TILE_K, TILE_V,
                      WRITE_LSE)


def attend_query_tile(Q, K, V, Out, Lse, batch, head, q_tile, out_slice, qk_scale,
                      query_offset, TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                      QUERY_GROUP: ConstInt, CAUSAL: ConstBool, TILE_K: ConstInt,
                      TILE_V: ConstInt, WRITE_LSE: ConstBool):
    """One query tile of one head, output slice `out_slice`: its TILE_V columns of Out and
    (from slice 0, with WRITE_LSE) its rows of Lse. A function of its own so that the
    variable-length kernel (kernels/varlen.py) runs this very code."""
    kv_head = head // QUERY_GROUP  # grouped-query attention: QUERY_GROUP heads share K/V
    k_len = K.shape[2]
    qk_scale_log2 = qk_scale * INV_LOG_2
    # This CTA's columns of V and of the output, as arrays of their own: its chunks' tile
    # indices then count from the slice's first column.
    first_column = out_slice * TILE_V
    V = V.slice(3, first_column, first_column + TILE_V)
    Out = Out.slice(3, first_column, first_column + TILE_V)

    # Under the causal mask query row i sees keys j <= i + query_offset: 0 aligns the
    # diagonal top-left (SDPA's is_causal), k_len - q_len bottom-right (a KV-cache prefill).
    last_key = (q_tile * TILE_M + query_offset + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    offs_n_in_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]

    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    accs = ()
    for _, width in ct.static_iter(output_chunks(TILE_V)):
        accs += (ct.full((TILE_M, width), 0.0, dtype=ct.float32),)

    # Key tiles from `mask_start` on need a mask: they reach past the causal diagonal
    # or past the last key. The ones before it run without any mask code.
    if CAUSAL:
        num_k_tiles = ct.cdiv(min((q_tile + 1) * TILE_M + query_offset, k_len), TILE_N)
        mask_start = min((q_tile * TILE_M + query_offset) // TILE_N, k_len // TILE_N)
    else:
        num_k_tiles = ct.cdiv(k_len, TILE_N)
        mask_start = k_len // TILE_N

    accs, m_i, l_i = attend(Q, K, V, accs, m_i, l_i, 0, mask_start, batch, head, kv_head,
                            q_tile, k_len, last_key, offs_n_in_tile, qk_scale_log2, TILE_D,
                            TILE_M, TILE_N, TILE_K, TILE_V, CAUSAL, False)
    accs, m_i, l_i = attend(Q, K, V, accs, m_i, l_i, max(mask_start, 0), num_k_tiles, batch,
                            head, kv_head, q_tile, k_len, last_key, offs_n_in_tile,
                            qk_scale_log2, TILE_D, TILE_M, TILE_N, TILE_K, TILE_V, CAUSAL, True)

    if CAUSAL:
        # Rows whose diagonal falls before the first key (bottom-right alignment with more
        # queries than keys) see no key: their output is 0, not 0/0.
        sees_a_key = last_key >= 0
    for index, (offset, width) in ct.static_iter(enumerate(output_chunks(TILE_V))):
        out = ct.truediv(accs[index], l_i, flush_to_zero=True,
                         rounding_mode=ct.RoundingMode.APPROX)
        if CAUSAL:
            out = ct.where(sees_a_key, out, 0.0)
        ct.store(Out, index=(batch, head, q_tile, offset // width),
                 tile=out.reshape((1, 1, TILE_M, width)).astype(Out.dtype))
    if WRITE_LSE:
        # Each row's log-sum-exp of its scaled scores, back from base 2 to natural log
        # (flash-attn's convention; -inf for a row that sees no key). Every slice of the
        # query tile computed the same sums: the first one writes them.
        lse = (m_i + ct.log2(l_i)) * LN_2
        if CAUSAL:
            lse = ct.where(sees_a_key, lse, -math.inf)
        if out_slice == 0:
            ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))
