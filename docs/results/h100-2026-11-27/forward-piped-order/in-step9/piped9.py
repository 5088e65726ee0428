"""Probe: step 9's forward without the mask, its unmasked loop in FlashAttention-3's order
(tile j+1's S = Q K^T issued after tile j's softmax and before tile j's P V) under PIPED,
else step 9's own loop; the masked tail as step 9's. Same signature and launch as step 9."""
import math

import cuda.tile as ct

from cutile_fmha.kernels import step9_unmasked_loop as step9
from cutile_fmha.kernels.common import INV_LOG_2, ConstBool, ConstInt

ZERO = ct.PaddingMode.ZERO


def load_k(K, batch, kv_head, j, TILE_D: ConstInt, TILE_N: ConstInt):
    return ct.load(K, index=(batch, kv_head, 0, j), shape=(1, 1, TILE_D, TILE_N),
                   order=(0, 1, 3, 2), padding_mode=ZERO, latency=2).reshape((TILE_D, TILE_N))


def load_v(V, batch, kv_head, j, TILE_D: ConstInt, TILE_N: ConstInt):
    return ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_D),
                   padding_mode=ZERO, latency=4).reshape((TILE_N, TILE_D))


def softmax_step(qk, m_i, l_i, qk_scale_log2):
    m_ij = ct.maximum(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
    p = ct.exp2(qk * qk_scale_log2 - m_ij, flush_to_zero=True)
    alpha = ct.exp2(m_i - m_ij, flush_to_zero=True)
    l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
    return p, alpha, m_ij, l_i


def attend_piped(Q, K, V, q, m_i, l_i, acc, first, end, batch, kv_head, qk_scale_log2,
                 TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt):
    """Tiles first..end-1 (end > first)."""
    qk = ct.mma(q, load_k(K, batch, kv_head, first, TILE_D, TILE_N),
                ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    for j in range(first, end - 1):
        p, alpha, m_i, l_i = softmax_step(qk, m_i, l_i, qk_scale_log2)
        qk = ct.mma(q, load_k(K, batch, kv_head, j + 1, TILE_D, TILE_N),
                    ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        acc = ct.mma(p.astype(Q.dtype), load_v(V, batch, kv_head, j, TILE_D, TILE_N),
                     acc * alpha)
    p, alpha, m_i, l_i = softmax_step(qk, m_i, l_i, qk_scale_log2)
    acc = ct.mma(p.astype(Q.dtype), load_v(V, batch, kv_head, end - 1, TILE_D, TILE_N),
                 acc * alpha)
    return m_i, l_i, acc


@ct.kernel
def fmha(Q, K, V, Out, Lse, qk_scale: float, query_offset: int, TILE_D: ConstInt,
         TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool,
         WRITE_LSE: ConstBool, PIPED: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    kv_head = head // QUERY_GROUP
    k_len = K.shape[2]
    qk_scale_log2 = qk_scale * INV_LOG_2
    offs_n_in_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    last_key = (q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ZERO).reshape((TILE_M, TILE_D))
    mask_start = k_len // TILE_N
    num_k_tiles = ct.cdiv(k_len, TILE_N)
    where = (batch, kv_head, k_len, last_key, offs_n_in_tile, qk_scale_log2)
    tiles = (TILE_D, 0, TILE_D, TILE_M, TILE_N, False)
    variants = (False, 0, False, 0.0, False, 0, 0, False, K, 0)
    if PIPED:
        if mask_start > 0:
            m_i, l_i, acc = attend_piped(Q, K, V, q, m_i, l_i, acc, 0, mask_start, batch,
                                         kv_head, qk_scale_log2, TILE_D, TILE_M, TILE_N)
    else:
        m_i, l_i, acc = step9.attend(Q, K, V, q, q, m_i, l_i, acc, 0, mask_start, *where,
                                     *tiles, False, *variants)
    m_i, l_i, acc = step9.attend(Q, K, V, q, q, m_i, l_i, acc, mask_start, num_k_tiles, *where,
                                 *tiles, True, *variants)
    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, TILE_D)).astype(Out.dtype))
