"""Probe: dQ accumulated in float32 with atomics inside the dK/dV kernel (5 products per tile
pair instead of 7 over two kernels). ORIENT 0: dQ^T = K^T dS^T (D x TILE_M), transposed back
for the add; ORIENT 1: dQ = dS K (TILE_M x D). ADD 0: tiled_view.atomic_store_add, 1:
ct.atomic_add with index tiles (2: unchecked bounds)."""
import cuda.tile as ct

from cutile_fmha.kernels.backward import (load_keys, load_rows, probabilities_and_ds,
                                          query_tile_ranges)
from cutile_fmha.kernels.common import ConstBool, ConstInt, tile_major
from cutile_fmha.kernels.step9_unmasked_loop import score_factors


def add_dq(dQacc, update, batch, head, q_tile, TILE_M: ConstInt, TILE_D: ConstInt,
           ADD: ConstInt):
    if ADD == 0:
        dQacc.tiled_view((1, 1, TILE_M, TILE_D)).atomic_store_add(
            (batch, head, q_tile, 0), update.reshape((1, 1, TILE_M, TILE_D)))
    else:
        rows = (q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[:, None]
        cols = ct.arange(TILE_D, dtype=ct.int32)[None, :]
        if ADD == 3:  # no atomic: a racy plain store, the lower bound of the atomics' cost
            ct.store(dQacc, index=(batch, head, q_tile, 0),
                     tile=update.reshape((1, 1, TILE_M, TILE_D)))
        elif ADD == 1:
            ct.atomic_add(dQacc, (batch, head, rows, cols), update,
                          memory_order=ct.MemoryOrder.RELAXED)
        else:
            ct.atomic_add(dQacc, (batch, head, rows, cols), update, check_bounds=False,
                          memory_order=ct.MemoryOrder.RELAXED)


def accumulate(Q, dO, Lse, Delta, dQacc, k, v, dk, dv, first_q_tile, end_q_tile, batch, kv_head,
               keys, k_len, qk_scale_log2, query_offset, TILE_D: ConstInt, TILE_M: ConstInt,
               TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool, MASKED: ConstBool,
               ORIENT: ConstInt, ADD: ConstInt):
    tiles_per_head = end_q_tile - first_q_tile
    for step in range(QUERY_GROUP * tiles_per_head):
        head = kv_head * QUERY_GROUP + step // tiles_per_head
        q_tile = first_q_tile + step % tiles_per_head
        q, _, do, lse_log2, delta = load_rows(Q, dO, Lse, Delta, batch, head, q_tile,
                                              TILE_M, TILE_D, 0, TILE_D)
        scores_t = ct.mma(k, ct.transpose(q), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        dp_t = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        rows = (q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[None, :]
        p_t, ds_t = probabilities_and_ds(scores_t, dp_t, lse_log2[None, :], delta[None, :], rows,
                                         keys, k_len, qk_scale_log2, query_offset, CAUSAL, MASKED,
                                         False, 1.0, False, 0, 0)
        ds_h = ds_t.astype(Q.dtype)
        dv = ct.mma(p_t.astype(Q.dtype), do, dv)
        dk = ct.mma(ds_h, q, dk)
        if ORIENT == 0:
            dq_t = ct.mma(ct.transpose(k), ds_h, ct.full((TILE_D, TILE_M), 0.0, dtype=ct.float32))
            update = ct.transpose(dq_t)
        else:
            update = ct.mma(ct.transpose(ds_h), k, ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32))
        add_dq(dQacc, update, batch, head, q_tile, TILE_M, TILE_D, ADD)
    return dk, dv


@ct.kernel
def dkdv_atomic(Q, K, V, dO, Lse, Delta, dK, dV, dQacc, qk_scale: float, query_offset: int,
                TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
                CAUSAL: ConstBool, ORIENT: ConstInt, ADD: ConstInt):
    k_tile, kv_head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:
        k_tile, kv_head, batch = tile_major(Q.shape[2] * TILE_D * 3 * 2 * QUERY_GROUP)
    q_len, k_len = Q.shape[2], K.shape[2]
    k_start = k_tile * TILE_N
    keys = (k_start + ct.arange(TILE_N, dtype=ct.int32))[:, None]
    qk_scale_log2, _ = score_factors(qk_scale, False, 1.0)
    k = load_keys(K, batch, kv_head, k_tile, TILE_D, TILE_N, False)
    v = load_keys(V, batch, kv_head, k_tile, TILE_D, TILE_N, False)
    dk = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    first, whole_start, whole_end, end = query_tile_ranges(
        k_start, q_len, query_offset, TILE_M, TILE_N, CAUSAL, False, 0, 0)
    inputs = (Q, dO, Lse, Delta, dQacc, k, v)
    where = (batch, kv_head, keys, k_len, qk_scale_log2, query_offset, TILE_D, TILE_M, TILE_N,
             QUERY_GROUP, CAUSAL)
    if CAUSAL:
        dk, dv = accumulate(*inputs, dk, dv, first, whole_start, *where, True, ORIENT, ADD)
    dk, dv = accumulate(*inputs, dk, dv, whole_start, whole_end, *where, False, ORIENT, ADD)
    ct.store(dK, index=(batch, kv_head, k_tile, 0),
             tile=(dk * qk_scale).reshape((1, 1, TILE_N, TILE_D)).astype(dK.dtype))
    ct.store(dV, index=(batch, kv_head, k_tile, 0),
             tile=dv.reshape((1, 1, TILE_N, TILE_D)).astype(dV.dtype))


FAMILY = None


def family():
    from cutile_fmha.steps.family import (_ATTENTION_SETTINGS, _QKV, Constant, KernelFamily,
                                          Tensor, tiles_per_head)
    return KernelFamily(
        name="probe dkdv atomic",
        parameters=_QKV + (Tensor("dO", 4), Tensor("Lse", 3, ct.float32),
                           Tensor("Delta", 3, ct.float32), Tensor("dK", 4), Tensor("dV", 4),
                           Tensor("dQacc", 4, ct.float32)) + _ATTENTION_SETTINGS
        + (Constant("ORIENT"), Constant("ADD")),
        grid=tiles_per_head("K", "TILE_N"))


def constants(head_dim, tile_m, tile_n, causal, orient, add, group=1):
    return {"TILE_D": head_dim, "TILE_M": tile_m, "TILE_N": tile_n, "QUERY_GROUP": group,
            "CAUSAL": causal, "ORIENT": orient, "ADD": add}
