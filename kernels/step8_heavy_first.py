"""Step 8: the heaviest causal query tiles first.

Under the causal mask the last query tiles see the most keys. The GPU starts CTAs in
the order of their block index, so with the tiles in order the longest ones start last and
the final wave waits on them while other SMs idle. Under CAUSAL the CTAs are numbered
longest first over the whole grid, not only within each head: the last query tile of
every head, then the one before, and so on (``query_tiles_longest_first``), so the short
tiles of all the heads fill the end. Heads are taken in groups whose K and V fit in L2
together, so that the CTAs running at once still share what they read. Non-causal tiles
all do the same work and keep their order.
"""

import math

import cuda.tile as ct

from ..platforms import occupancy_by_target, worker_warps_by_target
from .common import INV_LOG_2, LN_2, ConstBool, ConstInt, query_tiles_longest_first


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha(Q, K, V, Out, Lse, qk_scale: float, query_offset: int,
         TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:
        q_tile, head, batch = query_tiles_longest_first(K, TILE_D, TILE_D, QUERY_GROUP)
    kv_head = head // QUERY_GROUP  # grouped-query attention: QUERY_GROUP heads share K/V
    k_len = K.shape[2]
    qk_scale_log2 = qk_scale * INV_LOG_2

    # Under the causal mask query row i sees keys j <= i + query_offset: 0 aligns the
    # diagonal top-left (SDPA's is_causal), k_len - q_len bottom-right (a KV-cache prefill).
    last_key = (q_tile * TILE_M + query_offset + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    offs_n_in_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]

    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)

    q = ct.load(Q, index=(batch, head, q_tile, 0),
                shape=(1, 1, TILE_M, TILE_D)).reshape((TILE_M, TILE_D))

    # Key tiles from `mask_start` on need a mask: they reach past the causal diagonal
    # or past the last key.
    if CAUSAL:
        num_k_tiles = ct.cdiv(min((q_tile + 1) * TILE_M + query_offset, k_len), TILE_N)
        mask_start = min((q_tile * TILE_M + query_offset) // TILE_N, k_len // TILE_N)
    else:
        num_k_tiles = ct.cdiv(k_len, TILE_N)
        mask_start = k_len // TILE_N

    for j in range(0, num_k_tiles):
        k_t = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                      order=(0, 1, 3, 2), latency=2).reshape((TILE_D, TILE_N))
        qk = ct.mma(q, k_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        if j >= mask_start:
            offs_n = j * TILE_N + offs_n_in_tile
            visible = offs_n < k_len
            if CAUSAL:
                visible = visible & (last_key >= offs_n)
            qk = ct.where(visible, qk, -math.inf)

        m_ij = ct.maximum(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
        p = ct.exp2(qk * qk_scale_log2 - m_ij, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)  # rescales the old sums
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha

        # Zero padding: rows past the last key must add 0 * 0, not 0 * garbage.
        v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                    padding_mode=ct.PaddingMode.ZERO, latency=4).reshape((TILE_N, TILE_D))
        acc = ct.mma(p.astype(Q.dtype), v, acc)
        m_i = m_ij

    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    if CAUSAL:
        # Rows whose diagonal falls before the first key (bottom-right alignment with more
        # queries than keys) see no key: their output is 0, not 0/0.
        sees_a_key = last_key >= 0
        out = ct.where(sees_a_key, out, 0.0)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
    if WRITE_LSE:
        # Each row's log-sum-exp of its scaled scores, back from base 2 to natural log
        # (flash-attn's convention; -inf for a row that sees no key).
        lse = (m_i + ct.log2(l_i)) * LN_2
        if CAUSAL:
            lse = ct.where(sees_a_key, lse, -math.inf)
        ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))
