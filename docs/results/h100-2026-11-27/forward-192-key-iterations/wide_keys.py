"""Probe: key iterations of 192 keys as two products (128 + 64, then 64 + 128, so that every
load is tile-aligned) against step 9's loop of 128-key tiles, non-causal only, N a multiple
of 384. One running max, one rescale and one exp2 of alpha per 192 keys instead of per 128:
FA3's 128x176 idea where a tile's sizes must be powers of two. Same signature as step 9's
fmha (TILE_N: 128 = one product per iteration, 192 = the pair)."""
import math

import cuda.tile as ct

from cutile_fmha.kernels.common import INV_LOG_2, ConstBool, ConstInt


def keys_part(K, V, batch, kv_head, index, SIZE: ConstInt, TILE_D: ConstInt):
    k = ct.load(K, index=(batch, kv_head, 0, index), shape=(1, 1, TILE_D, SIZE),
                order=(0, 1, 3, 2), latency=2).reshape((TILE_D, SIZE))
    return k


def values_part(V, batch, kv_head, index, SIZE: ConstInt, TILE_D: ConstInt):
    return ct.load(V, index=(batch, kv_head, index, 0), shape=(1, 1, SIZE, TILE_D),
                   latency=4).reshape((SIZE, TILE_D))


def two_parts(Q, K, V, q, m_i, l_i, acc, batch, kv_head, index_a, index_b, scale,
              A: ConstInt, B: ConstInt, TILE_D: ConstInt, TILE_M: ConstInt):
    s_a = ct.mma(q, keys_part(K, V, batch, kv_head, index_a, A, TILE_D),
                 ct.full((TILE_M, A), 0.0, dtype=ct.float32))
    s_b = ct.mma(q, keys_part(K, V, batch, kv_head, index_b, B, TILE_D),
                 ct.full((TILE_M, B), 0.0, dtype=ct.float32))
    m_ij = ct.maximum(m_i, ct.maximum(ct.max(s_a, axis=-1, keepdims=True),
                                      ct.max(s_b, axis=-1, keepdims=True)) * scale)
    p_a = ct.exp2(s_a * scale - m_ij, flush_to_zero=True)
    p_b = ct.exp2(s_b * scale - m_ij, flush_to_zero=True)
    alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)
    l_i = l_i * alpha + ct.sum(p_a, axis=-1, keepdims=True) + ct.sum(p_b, axis=-1, keepdims=True)
    acc = acc * alpha
    acc = ct.mma(p_a.astype(Q.dtype), values_part(V, batch, kv_head, index_a, A, TILE_D), acc)
    acc = ct.mma(p_b.astype(Q.dtype), values_part(V, batch, kv_head, index_b, B, TILE_D), acc)
    return m_ij, l_i, acc


@ct.kernel(occupancy=1, num_worker_warps=8)
def fmha(Q, K, V, Out, Lse, qk_scale: float, query_offset: int,
         TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    kv_head = head // QUERY_GROUP
    k_len = K.shape[2]
    scale = qk_scale * INV_LOG_2
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D)).reshape(
        (TILE_M, TILE_D))
    if TILE_N == 128:
        for j in range(k_len // 128):
            k = keys_part(K, V, batch, kv_head, j, 128, TILE_D)
            s = ct.mma(q, k, ct.full((TILE_M, 128), 0.0, dtype=ct.float32))
            m_ij = ct.maximum(m_i, ct.max(s, axis=-1, keepdims=True) * scale)
            p = ct.exp2(s * scale - m_ij, flush_to_zero=True)
            alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)
            l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
            acc = acc * alpha
            acc = ct.mma(p.astype(Q.dtype), values_part(V, batch, kv_head, j, 128, TILE_D), acc)
            m_i = m_ij
    else:  # 384 keys a trip: [128 | 64] [64 | 128]
        for t in range(k_len // 384):
            m_i, l_i, acc = two_parts(Q, K, V, q, m_i, l_i, acc, batch, kv_head, 3 * t,
                                      6 * t + 2, scale, 128, 64, TILE_D, TILE_M)
            m_i, l_i, acc = two_parts(Q, K, V, q, m_i, l_i, acc, batch, kv_head, 6 * t + 3,
                                      3 * t + 2, scale, 64, 128, TILE_D, TILE_M)
    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
