"""The backward pass: gradients of softmax(Q K^T * scale) V, recomputing P.

The forward keeps no P, only each row's log-sum-exp (LSE), so the backward rebuilds each
tile of P = exp(S - LSE) from Q and K (FlashAttention's recomputation, section 7 of the
IO-aware analysis) and never holds more than one tile of it:

- ``row_dot``: Delta_i = sum_d O_id * dO_id, the softmax's correction term;
- ``dkdv``: one CTA per tile of keys of one K/V head, looping over every query tile (of
  every query head that shares the K/V head, so grouped-query gradients are summed here,
  with no expanded copy and no atomics): dV += P^T dO and dK += dS^T Q * scale, where
  dS = P * (dO V^T - Delta);
- ``dq``: one CTA per query tile, looping over the key tiles it sees: dQ += dS K * scale.

dK/dV and dQ are two kernels, as in FlashAttention-2's Triton tutorial: no float32
atomics, each output written once. Masks follow the forward: under CAUSAL query row i sees
keys j <= i + query_offset; rows and keys past the ends are masked.
"""

import cuda.tile as ct

from .common import INV_LOG_2, ConstBool, ConstInt

ZERO = ct.PaddingMode.ZERO


@ct.kernel
def row_dot(Out, dOut, Delta, TILE_M: ConstInt, TILE_D: ConstInt):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    o = ct.load(Out, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ZERO).reshape((TILE_M, TILE_D)).astype(ct.float32)
    do = ct.load(dOut, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ZERO).reshape((TILE_M, TILE_D)).astype(ct.float32)
    ct.store(Delta, index=(batch, head, q_tile), tile=ct.sum(o * do, axis=-1).reshape((1, 1, TILE_M)))


def probabilities_and_ds(q, do, k_t, v_t, lse_log2, delta, q_start, k_start, q_len, k_len,
                         qk_scale_log2, query_offset, TILE_M: ConstInt, TILE_N: ConstInt,
                         CAUSAL: ConstBool):
    """One (query tile, key tile) pair: P rebuilt from the LSE, and dS = P * (dP - Delta),
    both (TILE_M, TILE_N) float32, zero where masked."""
    qk = ct.mma(q, k_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    rows = (q_start + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    keys = (k_start + ct.arange(TILE_N, dtype=ct.int32))[None, :]
    visible = (rows < q_len) & (keys < k_len)
    if CAUSAL:
        visible = visible & (keys <= rows + query_offset)
    # A row that sees no key has LSE -inf: exp2 gives inf there, which `where` drops.
    p = ct.where(visible, ct.exp2(qk * qk_scale_log2 - lse_log2, flush_to_zero=True), 0.0)
    dp = ct.mma(do, v_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
    return p, p * (dp - delta)


def load_rows(Q, dO, Lse, Delta, batch, head, q_tile, TILE_M: ConstInt, TILE_D: ConstInt):
    """A query tile's Q and dO (TILE_M, D), LSE in base 2 and Delta (TILE_M, 1)."""
    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ZERO).reshape((TILE_M, TILE_D))
    do = ct.load(dO, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                 padding_mode=ZERO).reshape((TILE_M, TILE_D))
    lse = ct.load(Lse, index=(batch, head, q_tile), shape=(1, 1, TILE_M),
                  padding_mode=ZERO).reshape((TILE_M, 1))
    delta = ct.load(Delta, index=(batch, head, q_tile), shape=(1, 1, TILE_M),
                    padding_mode=ZERO).reshape((TILE_M, 1))
    return q, do, lse * INV_LOG_2, delta


def load_transposed(X, batch, kv_head, k_tile, TILE_D: ConstInt, TILE_N: ConstInt):
    """A K or V tile as (D, TILE_N), zero past the last key."""
    return ct.load(X, index=(batch, kv_head, 0, k_tile), shape=(1, 1, TILE_D, TILE_N),
                   order=(0, 1, 3, 2), padding_mode=ZERO).reshape((TILE_D, TILE_N))


@ct.kernel
def dkdv(Q, K, V, dO, Lse, Delta, dK, dV, qk_scale: float, query_offset: int,
         TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool):
    k_tile, kv_head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    q_len, k_len = Q.shape[2], K.shape[2]
    qk_scale_log2 = qk_scale * INV_LOG_2
    k_t = load_transposed(K, batch, kv_head, k_tile, TILE_D, TILE_N)
    v_t = load_transposed(V, batch, kv_head, k_tile, TILE_D, TILE_N)
    dk = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    # Under CAUSAL the query tiles above this key tile's first key see none of it.
    first_q_tile = 0
    if CAUSAL:
        first_q_tile = max(k_tile * TILE_N - query_offset, 0) // TILE_M
    for group_member in range(QUERY_GROUP):
        head = kv_head * QUERY_GROUP + group_member
        for q_tile in range(first_q_tile, ct.cdiv(q_len, TILE_M)):
            q, do, lse_log2, delta = load_rows(Q, dO, Lse, Delta, batch, head, q_tile,
                                               TILE_M, TILE_D)
            p, ds = probabilities_and_ds(q, do, k_t, v_t, lse_log2, delta, q_tile * TILE_M,
                                         k_tile * TILE_N, q_len, k_len, qk_scale_log2,
                                         query_offset, TILE_M, TILE_N, CAUSAL)
            dv = ct.mma(ct.transpose(p.astype(Q.dtype)), do, dv)
            dk = ct.mma(ct.transpose(ds.astype(Q.dtype)), q, dk)
    ct.store(dK, index=(batch, kv_head, k_tile, 0),
             tile=(dk * qk_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype))
    ct.store(dV, index=(batch, kv_head, k_tile, 0),
             tile=dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype))


@ct.kernel
def dq(Q, K, V, dO, Lse, Delta, dQ, qk_scale: float, query_offset: int,
       TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
       CAUSAL: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    kv_head = head // QUERY_GROUP
    q_len, k_len = Q.shape[2], K.shape[2]
    qk_scale_log2 = qk_scale * INV_LOG_2
    q, do, lse_log2, delta = load_rows(Q, dO, Lse, Delta, batch, head, q_tile, TILE_M, TILE_D)
    dq_acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    if CAUSAL:  # the key tiles up to this query tile's last visible key
        num_k_tiles = ct.cdiv(min((q_tile + 1) * TILE_M + query_offset, k_len), TILE_N)
    else:
        num_k_tiles = ct.cdiv(k_len, TILE_N)
    for k_tile in range(num_k_tiles):
        k_t = load_transposed(K, batch, kv_head, k_tile, TILE_D, TILE_N)
        v_t = load_transposed(V, batch, kv_head, k_tile, TILE_D, TILE_N)
        _, ds = probabilities_and_ds(q, do, k_t, v_t, lse_log2, delta, q_tile * TILE_M,
                                     k_tile * TILE_N, q_len, k_len, qk_scale_log2, query_offset,
                                     TILE_M, TILE_N, CAUSAL)
        dq_acc = ct.mma(ds.astype(Q.dtype), ct.transpose(k_t), dq_acc)
    ct.store(dQ, index=(batch, head, q_tile, 0),
             tile=(dq_acc * qk_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype))
