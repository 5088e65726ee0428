"""The backward pass: gradients of softmax(Q K^T * scale) V, recomputing P.

The forward keeps no P, only each row's log-sum-exp (LSE), so the backward rebuilds each
tile of P = exp(S - LSE) from Q and K (FlashAttention's recomputation, section 7 of the
IO-aware analysis) and never holds more than one tile of it:

- ``row_dot``: Delta_i = sum_d O_id * dO_id, the softmax's correction term;
- ``dkdv``: one CTA per tile of keys of one K/V head, looping over every query tile (of
  every query head that shares the K/V head, so grouped-query gradients are summed here,
  with no expanded copy and no atomics): dV += P^T dO and dK += dS^T Q * scale, where
  dS = P * (dO V^T - Delta); it works on keys x queries tiles, S^T = K Q^T;
- ``dq``: one CTA per query tile, looping over the key tiles it sees: dQ += dS K * scale;
  with DELTA_FROM_OUT it computes its tile's Delta itself and writes it, launched before
  dK/dV, which reads it (no row_dot launch then).

dK/dV and dQ are two kernels, as in FlashAttention-2's Triton tutorial: each output is
written once, with no float32 atomics; seven matrix products per tile pair. With ATOMIC_DQ
the dK/dV kernel also takes each tile pair's dS K and adds it to a float32 dQ with atomics
(FlashAttention-2's and -3's CUDA structure): five products, no dQ kernel. Which is faster
depends on the head dim (platforms/backward.py, docs/performance.md). With ADD_TO_DKDV
the dK/dV kernel adds its rows to the float32 dK and dV it is handed instead of writing
them: the launcher runs long query ranges in chunks and sums them so. Masks follow the
forward: under CAUSAL query row i
sees keys j <= i + query_offset. As in the forward's step 9, only the tile pairs across
the causal diagonal or past the last key run mask code; the loops over the others have
none.

The variants of kernels/variants.py are the constants SOFTCAP and WINDOW here too (the
sinks need none: the LSE holds their terms, and their gradient is a sum over rows, taken
outside): with SOFTCAP the scores are rebuilt through the same tanh t and dS gets the
tanh's derivative, 1 - t^2; with WINDOW the loops skip the tile pairs outside every
row's window, as the forward does, and mask those across its edges. Off, the code is not
there (tests/test_machine_code.py). So with TILE_D_TAIL: a head dim such as 96 can run Q's
and K's columns as two tiles (64 + 32), the forward's split, not padded; which head dims do
is the platform's (each launch's split_head_dims in platforms/backward.py).
"""

import cuda.tile as ct

from .common import INV_LOG_2, ConstBool, ConstInt, query_tiles_longest_first, tile_major
from .step9_unmasked_loop import key_tile_ranges, score_factors

ZERO = ct.PaddingMode.ZERO


def load_query_tile(X, batch, head, q_tile, TILE_M: ConstInt, TILE_D: ConstInt,
                    column_tile=0):
    """Rows q_tile * TILE_M.. of a (batch, heads, q_len, D) tensor as (TILE_M, TILE_D), its
    columns' tile `column_tile` of TILE_D, zero past the last query."""
    return ct.load(X, index=(batch, head, q_tile, column_tile), shape=(1, 1, TILE_M, TILE_D),
                   padding_mode=ZERO).reshape((TILE_M, TILE_D))


@ct.kernel
def row_dot(Out, dOut, Delta, TILE_M: ConstInt, TILE_D: ConstInt):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    o = load_query_tile(Out, batch, head, q_tile, TILE_M, TILE_D).astype(ct.float32)
    do = load_query_tile(dOut, batch, head, q_tile, TILE_M, TILE_D).astype(ct.float32)
    ct.store(Delta, index=(batch, head, q_tile), tile=ct.sum(o * do, axis=-1).reshape((1, 1, TILE_M)))


def probabilities_and_ds(scores, dp, lse_log2, delta, rows, keys, k_len, qk_scale_log2,
                         query_offset, CAUSAL: ConstBool, MASKED: ConstBool,
                         SOFTCAP: ConstBool, tanh_scale, WINDOW: ConstBool, window_left,
                         window_right):
    """One tile pair's P, rebuilt from the LSE, and dS = P * (dP - Delta), float32, from its
    raw products S = Q K^T and dP = dO V^T, in whichever orientation the arguments
    broadcast to: queries x keys for dQ (rows, LSE and Delta a column), keys x queries for
    dK/dV (a row). dS is the gradient of the products before qk_scale: with SOFTCAP, times
    the tanh's derivative. With MASKED, zero past the causal diagonal, the last key and the
    window. Rows past the last query need no mask: their zero Q, dO, LSE and Delta give
    P = 1 and dS = 0, which add nothing to dK or dV, and their dQ is never stored."""
    if SOFTCAP:
        capped = ct.tanh(scores * tanh_scale, rounding_mode=ct.RoundingMode.APPROX)
        p = ct.exp2(capped * qk_scale_log2 - lse_log2, flush_to_zero=True)
    else:
        p = ct.exp2(scores * qk_scale_log2 - lse_log2, flush_to_zero=True)
    if MASKED:
        visible = keys < k_len
        if CAUSAL:
            visible = visible & (keys <= rows + query_offset)
        if WINDOW:
            diagonal = rows + query_offset
            visible = visible & (keys >= diagonal - window_left) & \
                (keys <= diagonal + window_right)
        # A row that sees no key has LSE -inf: exp2 gives inf there, which `where` drops.
        p = ct.where(visible, p, 0.0)
    ds = p * (dp - delta)
    if SOFTCAP:  # d(softcap * tanh(x / softcap)) / dx = 1 - tanh^2
        ds = ds * (1.0 - capped * capped)
    return p, ds


def load_query_values(X, batch, head, q_tile, TILE_M: ConstInt):
    """A (batch, heads, q_len) tensor's values for one query tile, (TILE_M,)."""
    return ct.load(X, index=(batch, head, q_tile), shape=(1, 1, TILE_M),
                   padding_mode=ZERO).reshape((TILE_M,))


def load_rows(Q, dO, Lse, batch, head, q_tile, TILE_M: ConstInt, TILE_D: ConstInt,
              TILE_D_TAIL: ConstInt, TILE_DV: ConstInt):
    """A query tile's Q (TILE_M, TILE_D), Q's TILE_D_TAIL columns past those (q_tail; Q's
    tile again, unused, without them), dO (TILE_M, TILE_DV), and its LSE in base 2
    (TILE_M,)."""
    q = load_query_tile(Q, batch, head, q_tile, TILE_M, TILE_D)
    q_tail = q
    if TILE_D_TAIL > 0:
        q_tail = load_query_tile(Q, batch, head, q_tile, TILE_M, TILE_D_TAIL,
                                 TILE_D // TILE_D_TAIL)
    return (q, q_tail, load_query_tile(dO, batch, head, q_tile, TILE_M, TILE_DV),
            load_query_values(Lse, batch, head, q_tile, TILE_M) * INV_LOG_2)


def query_delta(Out, Delta, do, batch, head, q_tile, TILE_M: ConstInt, TILE_DV: ConstInt,
                DELTA_FROM_OUT: ConstBool):
    """A query tile's Delta = rowsum(O * dO), (TILE_M,): read from Delta (``row_dot``'s),
    or with DELTA_FROM_OUT computed here from Out and its dO tile `do` and written to
    Delta for the dK/dV kernel launched after (the two-kernel backward then needs no
    row_dot launch)."""
    if DELTA_FROM_OUT:
        o = load_query_tile(Out, batch, head, q_tile, TILE_M, TILE_DV).astype(ct.float32)
        delta = ct.sum(o * do.astype(ct.float32), axis=-1)
        ct.store(Delta, index=(batch, head, q_tile), tile=delta.reshape((1, 1, TILE_M)))
        return delta
    return load_query_values(Delta, batch, head, q_tile, TILE_M)


def load_keys(X, batch, kv_head, k_tile, TILE_D: ConstInt, TILE_N: ConstInt,
              TRANSPOSED: ConstBool, BY_TMA: ConstBool = True, column_tile=0):
    """A K or V tile, (TILE_N, TILE_D) or with TRANSPOSED (TILE_D, TILE_N), its columns'
    tile `column_tile` of TILE_D, zero past the last key; untransposed and not BY_TMA, by
    plain loads (see dkdv_key_tile)."""
    if TRANSPOSED:
        return ct.load(X, index=(batch, kv_head, column_tile, k_tile),
                       shape=(1, 1, TILE_D, TILE_N), order=(0, 1, 3, 2),
                       padding_mode=ZERO).reshape((TILE_D, TILE_N))
    return ct.load(X, index=(batch, kv_head, k_tile, column_tile), shape=(1, 1, TILE_N, TILE_D),
                   padding_mode=ZERO, allow_tma=BY_TMA).reshape((TILE_N, TILE_D))


def add_query_rows(dQAcc, tile, batch, head, q_tile, TILE_M: ConstInt, TILE_D: ConstInt,
                   column_tile=0):
    """Adds a (TILE_M, TILE_D) float32 tile to dQAcc's rows of q_tile, columns `column_tile`
    of TILE_D, with atomics. The tiled view's add is masked past the last row and column;
    unmasked (`ct.atomic_add(..., check_bounds=False)`) it compiles to vector REDG.F32x4
    adds, which measured 1.6-1.9x slower on an H100 than these per-element ones."""
    dQAcc.tiled_view((1, 1, TILE_M, TILE_D)).atomic_store_add(
        (batch, head, q_tile, column_tile), tile.reshape((1, 1, TILE_M, TILE_D)))


def add_dq(dQAcc, k, ds_t, batch, head, q_tile, qk_scale, TILE_D: ConstInt, TILE_M: ConstInt,
           column_tile=0):
    """One tile pair's dQ = dS K * qk_scale, added to dQAcc's rows of q_tile (columns
    `column_tile` of TILE_D): computed as dQ^T = K^T dS^T, whose keys x queries dS^T is the
    MMA's as it comes."""
    dq_t = ct.mma(ct.transpose(k), ds_t, ct.full((TILE_D, TILE_M), 0.0, dtype=ct.float32))
    add_query_rows(dQAcc, ct.transpose(dq_t) * qk_scale, batch, head, q_tile, TILE_M, TILE_D,
                   column_tile)


def add_pair_dq(dQAcc, k, k_tail, ds_t, batch, head, q_tile, qk_scale, TILE_D: ConstInt,
                TILE_D_TAIL: ConstInt, TILE_M: ConstInt):
    """One tile pair's dQ added to dQAcc (``add_dq``), with TILE_D_TAIL its columns past
    TILE_D too."""
    add_dq(dQAcc, k, ds_t, batch, head, q_tile, qk_scale, TILE_D, TILE_M)
    if TILE_D_TAIL > 0:
        add_dq(dQAcc, k_tail, ds_t, batch, head, q_tile, qk_scale, TILE_D_TAIL, TILE_M,
               TILE_D // TILE_D_TAIL)


def accumulate_dkdv(Q, dO, Lse, Delta, dQAcc, k, k_tail, v, dk, dk_tail, dv, first_q_tile,
                    end_q_tile, batch, kv_head, keys, k_len, qk_scale, qk_scale_log2,
                    query_offset, TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt,
                    TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool,
                    ATOMIC_DQ: ConstBool, DQ_LATE: ConstBool, MASKED: ConstBool,
                    SOFTCAP: ConstBool, tanh_scale, WINDOW: ConstBool, window_left,
                    window_right):
    """Query tiles first_q_tile..end_q_tile-1 of each query head of the K/V head's group
    into one key tile's dK and dV, as one flat loop over (head, query tile): a loop per
    head inside a loop over the group ran 2.8x slower with four heads to a group.
    The tiles are keys x queries (S^T = K Q^T), so P^T and dS^T go into the dV and dK
    products as they come out of the MMA, with no transpose. With TILE_D_TAIL, K's and Q's
    columns past TILE_D (k_tail) are products of their own, into dk_tail. With ATOMIC_DQ,
    each pair's dQ is added to dQAcc (``add_dq``); with DQ_LATE one turn late, after the
    next pair's dK and dV products. The compiler puts the dS^T that the dQ product reads
    in the shared memory where the float32 dQ tile then waits for its reduction, so each
    pair's dS^T waits until the reduction before it has read that tile: late, the wait
    comes after the dK and dV products instead of before them. Keys past the last one add
    nothing to dQ: K is zero there."""
    tiles_per_head = end_q_tile - first_q_tile
    # With DQ_LATE, the pair before: its dS^T, query head and query tile.
    last_ds_t = ct.full((TILE_N, TILE_M), 0.0, dtype=Q.dtype)
    last_head, last_q_tile = kv_head * QUERY_GROUP, first_q_tile
    for step in range(QUERY_GROUP * tiles_per_head):
        head = kv_head * QUERY_GROUP + step // tiles_per_head
        q_tile = first_q_tile + step % tiles_per_head
        q, q_tail, do, lse_log2 = load_rows(Q, dO, Lse, batch, head, q_tile, TILE_M, TILE_D,
                                            TILE_D_TAIL, TILE_DV)
        delta = load_query_values(Delta, batch, head, q_tile, TILE_M)
        scores_t = ct.mma(k, ct.transpose(q), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        if TILE_D_TAIL > 0:
            scores_t = ct.mma(k_tail, ct.transpose(q_tail), scores_t)
        dp_t = ct.mma(v, ct.transpose(do), ct.full((TILE_N, TILE_M), 0.0, dtype=ct.float32))
        rows = (q_tile * TILE_M + ct.arange(TILE_M, dtype=ct.int32))[None, :]
        p_t, ds_t = probabilities_and_ds(scores_t, dp_t, lse_log2[None, :], delta[None, :], rows,
                                         keys, k_len, qk_scale_log2, query_offset, CAUSAL, MASKED,
                                         SOFTCAP, tanh_scale, WINDOW, window_left, window_right)
        ds_t = ds_t.astype(Q.dtype)
        dv = ct.mma(p_t.astype(Q.dtype), do, dv)
        dk = ct.mma(ds_t, q, dk)
        if TILE_D_TAIL > 0:
            dk_tail = ct.mma(ds_t, q_tail, dk_tail)
        if ATOMIC_DQ:
            if DQ_LATE:
                if step > 0:
                    add_pair_dq(dQAcc, k, k_tail, last_ds_t, batch, last_head, last_q_tile,
                                qk_scale, TILE_D, TILE_D_TAIL, TILE_M)
                last_ds_t, last_head, last_q_tile = ds_t, head, q_tile
            else:
                add_pair_dq(dQAcc, k, k_tail, ds_t, batch, head, q_tile, qk_scale, TILE_D,
                            TILE_D_TAIL, TILE_M)
    if ATOMIC_DQ:
        if DQ_LATE:  # the last pair's
            if tiles_per_head > 0:
                add_pair_dq(dQAcc, k, k_tail, last_ds_t, batch, last_head, last_q_tile,
                            qk_scale, TILE_D, TILE_D_TAIL, TILE_M)
    return dk, dk_tail, dv


def dkdv_pair_bytes(q_rows, QK_COLUMNS: ConstInt, TILE_DV: ConstInt, QUERY_GROUP: ConstInt,
                    ATOMIC_DQ: ConstBool):
    """What the CTAs of one K/V head of one sequence share in L2 (``tile_major``): the Q
    and dO rows of its query heads and, with ATOMIC_DQ, the float32 dQ rows they add to."""
    row_bytes = (QK_COLUMNS + TILE_DV) * 2
    if ATOMIC_DQ:
        row_bytes = row_bytes + QK_COLUMNS * 4
    return q_rows * row_bytes * QUERY_GROUP


@ct.kernel
def dkdv(Q, K, V, dO, Lse, Delta, dK, dV, dQAcc, qk_scale: float, query_offset: int,
         softcap: float, window_left: int, window_right: int, TILE_D: ConstInt,
         TILE_D_TAIL: ConstInt, TILE_DV: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
         QUERY_GROUP: ConstInt, CAUSAL: ConstBool, SOFTCAP: ConstBool, WINDOW: ConstBool,
         ATOMIC_DQ: ConstBool, ADD_TO_DKDV: ConstBool, DQ_LATE: ConstBool):
    k_tile, kv_head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:  # key tile 0 sees the most queries: tile by tile over heads, longest first
        k_tile, kv_head, batch = tile_major(dkdv_pair_bytes(Q.shape[2], TILE_D + TILE_D_TAIL,
                                                            TILE_DV, QUERY_GROUP, ATOMIC_DQ))
    dkdv_key_tile(Q, K, V, dO, Lse, Delta, dK, dV, dQAcc, batch, kv_head, k_tile, qk_scale,
                  query_offset, TILE_D, TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP,
                  CAUSAL, SOFTCAP, softcap, WINDOW, window_left, window_right, ATOMIC_DQ,
                  DQ_LATE, ADD_TO_DKDV)


def query_tile_ranges(k_start, q_len, query_offset, TILE_M: ConstInt, TILE_N: ConstInt,
                      CAUSAL: ConstBool, WINDOW: ConstBool, window_left, window_right):
    """The query tiles that see the key tile of keys k_start..k_start+TILE_N-1, in four
    bounds (first, whole_start, whole_end, end): every row of the tiles from whole_start
    to whole_end-1 sees all of its keys (no mask code); those from first to whole_start-1
    (above the causal diagonal, or the window's upper edge) and, under WINDOW, from
    whole_end to end-1 (past the window's lower edge) see part of it (masked); the others
    see none of it and are never loaded. Keys past the last one need no mask here: they
    reach only their own rows of dK and dV, which are never stored."""
    end = ct.cdiv(q_len, TILE_M)
    first, whole_start, whole_end = 0, 0, end
    k_last = k_start + TILE_N - 1
    if CAUSAL:
        first = min(max(k_start - query_offset, 0) // TILE_M, end)
        whole_start = min(ct.cdiv(max(k_last - query_offset, 0), TILE_M), end)
    if WINDOW:  # row i sees keys i + query_offset - window_left .. + window_right
        first = min(max(k_start - query_offset - window_right, 0) // TILE_M, end)
        end = min(ct.cdiv(max(k_last - query_offset + window_left + 1, 0), TILE_M), end)
        whole_start = min(max(ct.cdiv(max(k_last - query_offset - window_right, 0), TILE_M),
                              first), end)
        whole_end = min(max(max(k_start - query_offset + window_left + 1, 0) // TILE_M,
                            whole_start), end)
    return first, whole_start, whole_end, end


def dkdv_key_tile(Q, K, V, dO, Lse, Delta, dK, dV, dQAcc, batch, kv_head, k_tile, qk_scale,
                  query_offset, TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt,
                  TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool,
                  SOFTCAP: ConstBool, softcap, WINDOW: ConstBool, window_left, window_right,
                  ATOMIC_DQ: ConstBool, DQ_LATE: ConstBool, ADD_TO_DKDV: ConstBool,
                  KEYS_BY_TMA: ConstBool = True):
    """One key tile of one K/V head: its rows of dK and dV, from every query that sees it
    (the variable-length kernel runs it on views of one sequence), and with ATOMIC_DQ its
    share of every such query's dQ, added to dQAcc. Not KEYS_BY_TMA, the
    key tile, read once, comes by plain loads: on a view the CTA writes each TMA load's
    tensor map itself, and two fewer made the variable-length dK/dV 3% faster at D=64.
    TILE_D_TAIL: Q's and K's columns past TILE_D as products of their own (0: none), as in
    the forward (step 9's ``attend_query_tile``): D=96 runs 64 + 32 columns, not 128."""
    q_len, k_len = Q.shape[2], K.shape[2]
    k_start = k_tile * TILE_N
    keys = (k_start + ct.arange(TILE_N, dtype=ct.int32))[:, None]
    qk_scale_log2, tanh_scale = score_factors(qk_scale, SOFTCAP, softcap)
    k = load_keys(K, batch, kv_head, k_tile, TILE_D, TILE_N, False, KEYS_BY_TMA)
    v = load_keys(V, batch, kv_head, k_tile, TILE_DV, TILE_N, False, KEYS_BY_TMA)
    dk = ct.full((TILE_N, TILE_D), 0.0, dtype=ct.float32)
    dv = ct.full((TILE_N, TILE_DV), 0.0, dtype=ct.float32)
    k_tail, dk_tail = k, dk  # unused without TILE_D_TAIL
    if TILE_D_TAIL > 0:
        k_tail = load_keys(K, batch, kv_head, k_tile, TILE_D_TAIL, TILE_N, False, KEYS_BY_TMA,
                           TILE_D // TILE_D_TAIL)
        dk_tail = ct.full((TILE_N, TILE_D_TAIL), 0.0, dtype=ct.float32)
    # Grouped-query heads sum into one dK and dV.
    first, whole_start, whole_end, end = query_tile_ranges(
        k_start, q_len, query_offset, TILE_M, TILE_N, CAUSAL, WINDOW, window_left, window_right)
    inputs = (Q, dO, Lse, Delta, dQAcc, k, k_tail, v)
    where = (batch, kv_head, keys, k_len, qk_scale, qk_scale_log2, query_offset, TILE_D,
             TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, ATOMIC_DQ, DQ_LATE)
    variants = (SOFTCAP, tanh_scale, WINDOW, window_left, window_right)
    grads = (dk, dk_tail, dv)
    if CAUSAL or WINDOW:
        grads = accumulate_dkdv(*inputs, *grads, first, whole_start, *where, True, *variants)
    grads = accumulate_dkdv(*inputs, *grads, whole_start, whole_end, *where, False, *variants)
    if WINDOW:  # the query tiles across the window's lower edge
        grads = accumulate_dkdv(*inputs, *grads, whole_end, end, *where, True, *variants)
    dk, dk_tail, dv = grads
    store_key_rows(dK, dk * qk_scale, batch, kv_head, k_tile, TILE_D, TILE_N, ADD_TO_DKDV,
                   KEYS_BY_TMA)
    if TILE_D_TAIL > 0:
        store_key_rows(dK, dk_tail * qk_scale, batch, kv_head, k_tile, TILE_D_TAIL, TILE_N,
                       ADD_TO_DKDV, KEYS_BY_TMA, TILE_D // TILE_D_TAIL)
    store_key_rows(dV, dv, batch, kv_head, k_tile, TILE_DV, TILE_N, ADD_TO_DKDV, KEYS_BY_TMA)


def store_key_rows(X, tile, batch, kv_head, k_tile, TILE_D: ConstInt, TILE_N: ConstInt,
                   ADD_TO_DKDV: ConstBool, BY_TMA: ConstBool, column_tile=0):
    """Stores a (TILE_N, TILE_D) float32 tile of dK or dV as X's rows of key tile k_tile,
    its columns' tile `column_tile` of TILE_D; with ADD_TO_DKDV added to what X holds there
    (float32: the sum of the query chunks before this one; the CTA owns these rows)."""
    if ADD_TO_DKDV:
        tile = tile + load_keys(X, batch, kv_head, k_tile, TILE_D, TILE_N, False, BY_TMA,
                                column_tile)
    ct.store(X, index=(batch, kv_head, k_tile, column_tile),
             tile=tile.reshape((1, 1, TILE_N, TILE_D)).astype(X.dtype))


def accumulate_dq(Q, K, V, q, q_tail, do, lse_log2, delta, dq, dq_tail, first_k_tile,
                  end_k_tile, batch, kv_head, rows, k_len, qk_scale_log2, query_offset,
                  TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt, TILE_M: ConstInt,
                  TILE_N: ConstInt, CAUSAL: ConstBool, MASKED: ConstBool, SOFTCAP: ConstBool,
                  tanh_scale, WINDOW: ConstBool, window_left, window_right):
    """Key tiles first_k_tile..end_k_tile-1 into one query tile's dQ (with TILE_D_TAIL, its
    columns past TILE_D into dq_tail)."""
    for k_tile in range(first_k_tile, end_k_tile):
        k_t = load_keys(K, batch, kv_head, k_tile, TILE_D, TILE_N, True)
        v_t = load_keys(V, batch, kv_head, k_tile, TILE_DV, TILE_N, True)
        scores = ct.mma(q, k_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        if TILE_D_TAIL > 0:
            k_t_tail = load_keys(K, batch, kv_head, k_tile, TILE_D_TAIL, TILE_N, True,
                                 column_tile=TILE_D // TILE_D_TAIL)
            scores = ct.mma(q_tail, k_t_tail, scores)
        dp = ct.mma(do, v_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32))
        keys = (k_tile * TILE_N + ct.arange(TILE_N, dtype=ct.int32))[None, :]
        _, ds = probabilities_and_ds(scores, dp, lse_log2, delta, rows, keys, k_len,
                                     qk_scale_log2, query_offset, CAUSAL, MASKED, SOFTCAP,
                                     tanh_scale, WINDOW, window_left, window_right)
        dq = ct.mma(ds.astype(Q.dtype), ct.transpose(k_t), dq)
        if TILE_D_TAIL > 0:
            dq_tail = ct.mma(ds.astype(Q.dtype), ct.transpose(k_t_tail), dq_tail)
    return dq, dq_tail


@ct.kernel
def dq(Q, K, V, dO, Lse, Delta, dQ, Out, qk_scale: float, query_offset: int, softcap: float,
       window_left: int, window_right: int, TILE_D: ConstInt, TILE_D_TAIL: ConstInt,
       TILE_DV: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
       CAUSAL: ConstBool, SOFTCAP: ConstBool, WINDOW: ConstBool, DELTA_FROM_OUT: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:  # as in the forward's step 8
        q_tile, head, batch = query_tiles_longest_first(K, TILE_D + TILE_D_TAIL, TILE_DV,
                                                        QUERY_GROUP)
    dq_query_tile(Q, K, V, dO, Lse, Delta, dQ, Out, batch, head, q_tile, qk_scale, query_offset,
                  TILE_D, TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, SOFTCAP,
                  softcap, WINDOW, window_left, window_right, DELTA_FROM_OUT)


def dq_query_tile(Q, K, V, dO, Lse, Delta, dQ, Out, batch, head, q_tile, qk_scale,
                  query_offset, TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt,
                  TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool,
                  SOFTCAP: ConstBool, softcap, WINDOW: ConstBool, window_left, window_right,
                  DELTA_FROM_OUT: ConstBool):
    """One query tile of one head: its rows of dQ, from every key it sees (the key tiles
    the forward's step 9 visits, masked where it masks); TILE_D_TAIL as in dkdv_key_tile;
    DELTA_FROM_OUT as in ``query_delta``."""
    kv_head = head // QUERY_GROUP
    q_start, k_len = q_tile * TILE_M, K.shape[2]
    rows = (q_start + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    qk_scale_log2, tanh_scale = score_factors(qk_scale, SOFTCAP, softcap)
    q, q_tail, do, lse_log2 = load_rows(Q, dO, Lse, batch, head, q_tile, TILE_M, TILE_D,
                                        TILE_D_TAIL, TILE_DV)
    delta = query_delta(Out, Delta, do, batch, head, q_tile, TILE_M, TILE_DV, DELTA_FROM_OUT)
    lse_log2, delta = lse_log2[:, None], delta[:, None]
    dq_acc = ct.full((TILE_M, TILE_D), 0.0, dtype=ct.float32)
    dq_tail = dq_acc  # unused without TILE_D_TAIL
    if TILE_D_TAIL > 0:
        dq_tail = ct.full((TILE_M, TILE_D_TAIL), 0.0, dtype=ct.float32)
    first, whole_start, mask_start, end = key_tile_ranges(
        q_start, q_start + TILE_M, k_len, query_offset, TILE_N, CAUSAL, WINDOW, window_left,
        window_right)
    inputs = (Q, K, V, q, q_tail, do, lse_log2, delta)
    where = (batch, kv_head, rows, k_len, qk_scale_log2, query_offset, TILE_D, TILE_D_TAIL,
             TILE_DV, TILE_M, TILE_N, CAUSAL)
    variants = (SOFTCAP, tanh_scale, WINDOW, window_left, window_right)
    grads = (dq_acc, dq_tail)
    if WINDOW:  # the key tiles across the window's lower edge
        grads = accumulate_dq(*inputs, *grads, first, whole_start, *where, True, *variants)
    grads = accumulate_dq(*inputs, *grads, whole_start, mask_start, *where, False, *variants)
    grads = accumulate_dq(*inputs, *grads, max(mask_start, whole_start), end, *where, True,
                          *variants)
    dq_acc, dq_tail = grads
    ct.store(dQ, index=(batch, head, q_tile, 0),
             tile=(dq_acc * qk_scale).reshape((1, 1, TILE_M, TILE_D)).astype(dQ.dtype))
    if TILE_D_TAIL > 0:
        ct.store(dQ, index=(batch, head, q_tile, TILE_D // TILE_D_TAIL),
                 tile=(dq_tail * qk_scale).reshape((1, 1, TILE_M, TILE_D_TAIL)).astype(dQ.dtype))
