"""Where the sliding window's extra time per key tile goes: step 9's query tile with the
window (kernels/variants.py) in four forms, FORM:
0 the committed order: the lower edge's masked tiles, the unmasked tiles, the diagonal's;
1 the lower edge's tiles left out (wrong output: a bound on what they cost);
2 the lower edge's tiles run unmasked with the others (wrong output: their mask's cost);
3 the unmasked tiles first, then one masked loop over the diagonal's tiles and then the
  lower edge's (one loop fewer; the same output up to the order of the sums)."""
import math

import cuda.tile as ct

from cutile_fmha.kernels.common import INV_LOG_2, LN_2, ConstBool, ConstInt, query_tiles_longest_first
from cutile_fmha.kernels.step9_unmasked_loop import key_tile_ranges, score_factors


def attend(Q, K, V, q, m_i, l_i, acc, first_tile, end_tile, wrap_end, wrap_first, batch,
           kv_head, k_len, last_key, offs_n_in_tile, qk_scale_log2, TILE_D: ConstInt,
           TILE_DV: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, CAUSAL: ConstBool,
           MASKED: ConstBool, WRAP: ConstBool, window_left, window_right):
    """step 9's ``attend`` for a dense bf16 cache with WINDOW on, no softcap or tail; WRAP:
    tile i >= wrap_end is tile i - wrap_end + wrap_first."""
    for i in range(first_tile, end_tile):
        j = i
        if WRAP:
            if i >= wrap_end:
                j = i - wrap_end + wrap_first
        k_t = ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                      order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO,
                      latency=2).reshape((TILE_D, TILE_N))
        qk = ct.mma(q, k_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        if MASKED:
            offs_n = j * TILE_N + offs_n_in_tile
            visible = offs_n < k_len
            if CAUSAL:
                visible = visible & (last_key >= offs_n)
            visible = visible & (offs_n >= last_key - window_left) & \
                (offs_n <= last_key + window_right)
            qk = ct.where(visible, qk, -math.inf)
        m_ij = ct.maximum(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
        m_subtracted = m_ij
        if MASKED:
            m_subtracted = ct.where(m_ij == -math.inf, 0.0, m_ij)
        p = ct.exp2(qk * qk_scale_log2 - m_subtracted, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_subtracted, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha
        v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_DV),
                    order=(0, 1, 2, 3), padding_mode=ct.PaddingMode.ZERO,
                    latency=4).reshape((TILE_N, TILE_DV))
        acc = ct.mma(p.astype(Q.dtype), v, acc)
        m_i = m_ij
    return m_i, l_i, acc


@ct.kernel(occupancy=1, num_worker_warps=8)
def fmha_probe(Q, K, V, Out, Lse, Sinks, qk_scale: float, query_offset: int, softcap: float,
               window_left: int, window_right: int, TILE_D: ConstInt, TILE_D_TAIL: ConstInt,
               TILE_DV: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
               CAUSAL: ConstBool, WRITE_LSE: ConstBool, SOFTCAP: ConstBool, WINDOW: ConstBool,
               SINKS: ConstBool, FORM: ConstInt):
    q_tile, head, batch = query_tiles_longest_first(K, TILE_D, TILE_DV, QUERY_GROUP)
    kv_head = head // QUERY_GROUP
    k_len = K.shape[2]
    qk_scale_log2, _ = score_factors(qk_scale, False, 0.0)
    last_key = (q_tile * TILE_M + query_offset + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    offs_n_in_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_DV), 0.0, dtype=ct.float32)
    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    first, whole_start, mask_start, end = key_tile_ranges(
        q_tile * TILE_M, (q_tile + 1) * TILE_M, k_len, query_offset, TILE_N, CAUSAL, True,
        window_left, window_right)
    where = (batch, kv_head, k_len, last_key, offs_n_in_tile, qk_scale_log2, TILE_D, TILE_DV,
             TILE_M, TILE_N, CAUSAL)
    diagonal = max(mask_start, whole_start)
    if FORM == 0:
        m_i, l_i, acc = attend(Q, K, V, q, m_i, l_i, acc, first, whole_start, 0, 0, *where,
                               True, False, window_left, window_right)
    unmasked_from = whole_start
    if FORM == 2:
        unmasked_from = first
    m_i, l_i, acc = attend(Q, K, V, q, m_i, l_i, acc, unmasked_from, mask_start, 0, 0, *where,
                           False, False, window_left, window_right)
    if FORM == 3:
        m_i, l_i, acc = attend(Q, K, V, q, m_i, l_i, acc, diagonal,
                               end + whole_start - first, end, first, *where, True, True,
                               window_left, window_right)
    else:
        m_i, l_i, acc = attend(Q, K, V, q, m_i, l_i, acc, diagonal, end, 0, 0, *where, True,
                               False, window_left, window_right)
    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    out = ct.where(l_i > 0.0, out, 0.0)
    sees_a_key = last_key >= 0
    out = ct.where(sees_a_key, out, 0.0)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, TILE_DV)).astype(Out.dtype))
