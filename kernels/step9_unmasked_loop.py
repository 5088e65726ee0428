"""Step 9: the key loop split into an unmasked and a masked part.

Steps 1-8 test ``j >= mask_start`` on every key tile. Here the tiles below the causal
diagonal (and, without CAUSAL, all but a ragged last tile) run in a loop of their own
with no mask code at all, and only the tiles on the diagonal or past the last key run
the masked body: one helper, ``attend``, with the mask a compile-time choice, called for
each range, as Triton's tutorial does with its off-band and on-band stages. The main loop
is then straight-line code the compiler can pipeline without a branch.

``attend_query_tile`` also takes the constants FP8, SOFTCAP, WINDOW and SINKS, for the
kernels that run this step's code on float8 inputs (kernels/fp8.py) and with the
variants (kernels/variants.py); this step's kernel passes them off, and off they compile
to nothing (tests/test_machine_code.py).
"""

import math

import cuda.tile as ct

from ..platforms import occupancy_by_target, worker_warps_by_target
from .common import (INV_LOG_2, LN_2, ConstBool, ConstInt, exp2_split, joined,
                     query_tiles_longest_first)


def attend(Q, K, V, q, q_tail, m_i, l_i, acc, first_tile, end_tile, batch, kv_head, k_len,
           last_key, offs_n_in_tile, qk_scale_log2, TILE_D: ConstInt, TILE_D_TAIL: ConstInt,
           TILE_DV: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, CAUSAL: ConstBool,
           MASKED: ConstBool, FP8: ConstBool, FMA_EXP2: ConstInt, SOFTCAP: ConstBool,
           tanh_scale, WINDOW: ConstBool, window_left, window_right,
           ROWS_MAY_SEE_NOTHING: ConstBool, BlockTable, BLOCK_ROWS: ConstInt):
    """Key tiles first_tile..end_tile-1 into the running (m_i, l_i, acc); with MASKED, past
    the causal diagonal, the last key and the window are masked. FP8: V is stored
    transposed (see kernels/fp8.py). FMA_EXP2: one exponential in FMA_EXP2 of the
    unmasked tiles on the FMA pipes (``exp2_split``; 0: none). SOFTCAP: the scores are
    tanh(qk * tanh_scale), which qk_scale_log2 then scales (see kernels/variants.py).
    WINDOW: row i sees keys last_key[i] - window_left to last_key[i] + window_right.
    TILE_D_TAIL: Q's and K's columns past TILE_D (q_tail), a product of their own
    (``attend_query_tile``). ROWS_MAY_SEE_NOTHING: a masked tile may be the first a row
    sees and hold none of its keys (a window's edge; a split of the decode kernel).
    BLOCK_ROWS (0: K and V are (batch, heads, keys, D)): K and V are a paged cache
    (blocks, BLOCK_ROWS, heads, D), and sequence `batch`'s key k is in block
    BlockTable[batch, k // BLOCK_ROWS] (the decode kernel's; not with FP8, whose V is
    stored transposed): a tile of a block or less is one load, a tile of several blocks
    one load and one product per block."""
    k_order, v_order = (0, 1, 3, 2), (0, 1, 2, 3)  # as (batch, heads, D, keys), (.., keys, D)
    if BLOCK_ROWS > 0:
        k_order, v_order = (0, 2, 3, 1), (0, 2, 1, 3)
    # A tile of several blocks: a product per block on its own TMA load, the scores
    # joined (joining the keys went through registers: kernels/decode.py's ``attend``).
    TILES_PER_BLOCK = BLOCK_ROWS // TILE_N
    BLOCKS_PER_TILE = TILE_N // BLOCK_ROWS if 0 < BLOCK_ROWS < TILE_N else 0
    for j in range(first_tile, end_tile):
        sequence, tile = batch, j
        if TILES_PER_BLOCK > 0:
            sequence = block_of(K, BlockTable, batch, j // TILES_PER_BLOCK)
            tile = j % TILES_PER_BLOCK
        if BLOCKS_PER_TILE > 0:
            blocks, scores = (), ()
            for b in ct.static_iter(range(BLOCKS_PER_TILE)):
                blocks += (block_of(K, BlockTable, batch, j * BLOCKS_PER_TILE + b),)
                k_b = ct.load(K, index=(blocks[b], kv_head, 0, 0),
                              shape=(1, 1, TILE_D, BLOCK_ROWS), order=k_order,
                              padding_mode=ct.PaddingMode.ZERO,
                              latency=2).reshape((TILE_D, BLOCK_ROWS))
                scores += (ct.mma(q, k_b, ct.full((TILE_M, BLOCK_ROWS), 0.0,
                                                  dtype=ct.float32)),)
            qk = joined(scores, 1)
        else:
            k_t = ct.load(K, index=(sequence, kv_head, 0, tile), shape=(1, 1, TILE_D, TILE_N),
                          order=k_order, padding_mode=ct.PaddingMode.ZERO,
                          latency=2).reshape((TILE_D, TILE_N))
            # FP8: both products accumulate in the tensor cores (fast accumulation, see
            # kernels/fp8.py), as the bfloat16 ones do.
            qk = ct.mma(q, k_t, ct.full((TILE_M, TILE_N), 0.0, dtype=ct.float32),
                        use_fast_acc=FP8)
        if TILE_D_TAIL > 0:
            k_tail = ct.load(K, index=(sequence, kv_head, TILE_D // TILE_D_TAIL, tile),
                             shape=(1, 1, TILE_D_TAIL, TILE_N), order=k_order,
                             padding_mode=ct.PaddingMode.ZERO,
                             latency=2).reshape((TILE_D_TAIL, TILE_N))
            qk = ct.mma(q_tail, k_tail, qk)
        if SOFTCAP:
            qk = ct.tanh(qk * tanh_scale, rounding_mode=ct.RoundingMode.APPROX)
        if MASKED:
            offs_n = j * TILE_N + offs_n_in_tile
            visible = offs_n < k_len
            if CAUSAL:
                visible = visible & (last_key >= offs_n)
            if WINDOW:
                visible = visible & (offs_n >= last_key - window_left) & \
                    (offs_n <= last_key + window_right)
            qk = ct.where(visible, qk, -math.inf)

        m_ij = ct.maximum(m_i, ct.max(qk, axis=-1, keepdims=True) * qk_scale_log2)
        m_subtracted = m_ij
        if ROWS_MAY_SEE_NOTHING:
            if MASKED:
                # A row can see no key of a tile at a window's edge, and none before it:
                # subtract 0, not -inf (exp2(-inf + inf) would be NaN), so its p is 0.
                m_subtracted = ct.where(m_ij == -math.inf, 0.0, m_ij)
        exponent = qk * qk_scale_log2 - m_subtracted
        if FMA_EXP2 > 0 and not MASKED:
            # float8 products take half as long as 16-bit ones, the exponentials as long:
            # a share of them on the FMA pipes (unmasked tiles: finite exponents)
            p = exp2_split(exponent, FMA_EXP2)
        else:
            p = ct.exp2(exponent, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_subtracted, flush_to_zero=True)  # rescales the old sums
        l_i = l_i * alpha + ct.sum(p, axis=-1, keepdims=True)
        acc = acc * alpha

        # Zero padding: rows past the last key must add 0 * 0, not 0 * garbage.
        if BLOCKS_PER_TILE > 0:
            p = p.astype(Q.dtype)
            for b in ct.static_iter(range(BLOCKS_PER_TILE)):
                v = ct.load(V, index=(blocks[b], kv_head, 0, 0),
                            shape=(1, 1, BLOCK_ROWS, TILE_DV), order=v_order,
                            padding_mode=ct.PaddingMode.ZERO,
                            latency=4).reshape((BLOCK_ROWS, TILE_DV))
                acc = ct.mma(ct.extract(p, (0, b), (TILE_M, BLOCK_ROWS)), v, acc)
        else:
            if FP8:
                v = ct.load(V, index=(batch, kv_head, j, 0), shape=(1, 1, TILE_N, TILE_DV),
                            order=(0, 1, 3, 2), padding_mode=ct.PaddingMode.ZERO,
                            latency=4).reshape((TILE_N, TILE_DV))
            else:
                v = ct.load(V, index=(sequence, kv_head, tile, 0),
                            shape=(1, 1, TILE_N, TILE_DV), order=v_order,
                            padding_mode=ct.PaddingMode.ZERO,
                            latency=4).reshape((TILE_N, TILE_DV))
            acc = ct.mma(p.astype(Q.dtype), v, acc, use_fast_acc=FP8)
        m_i = m_ij
    return m_i, l_i, acc


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha(Q, K, V, Out, Lse, qk_scale: float, query_offset: int,
         TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:
        q_tile, head, batch = query_tiles_longest_first(K, TILE_D, TILE_D, QUERY_GROUP)
    attend_query_tile(Q, K, V, Out, Lse, batch, head, q_tile, qk_scale, query_offset, TILE_D,
                      0, TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE, False, 1.0, 0,
                      False, 0.0, False, 0, 0, False, Lse)


def attend_query_tile(Q, K, V, Out, Lse, batch, head, q_tile, qk_scale, query_offset,
                      TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt,
                      TILE_M: ConstInt, TILE_N: ConstInt,
                      QUERY_GROUP: ConstInt, CAUSAL: ConstBool, WRITE_LSE: ConstBool,
                      FP8: ConstBool, v_scale, FMA_EXP2: ConstInt, SOFTCAP: ConstBool, softcap,
                      WINDOW: ConstBool, window_left, window_right, SINKS: ConstBool, Sinks):
    """One query tile of one head against every key it sees: its rows of Out and (with
    WRITE_LSE) of Lse; TILE_D columns of Q and K, TILE_DV of V and Out (this step's kernel:
    the same), and with TILE_D_TAIL (a power of two dividing TILE_D; 0: none) Q's and K's
    next TILE_D_TAIL columns as a second product of their own, so that a head dim such as
    96 (64 + 32) runs Q K^T on its own columns, not padded to 128. A function of its own so
    that the variable-length kernel (kernels/varlen.py), the FP8 one (kernels/fp8.py) and
    the variants' (kernels/variants.py) run this very code, the first on views of one
    sequence. The constants after WRITE_LSE each turn on one variant, with its run-time
    values after it (unused when off): FP8: float8 inputs, V stored transposed, the output
    multiplied by `v_scale` (V's dequantization factor). FMA_EXP2: a share of the
    exponentials on the FMA pipes (``attend``). SOFTCAP: scores softcap * tanh(scores /
    softcap). WINDOW: row i sees keys within window_left before and
    window_right after its diagonal key. SINKS: one more logit per head, Sinks[head], in
    each row's softmax denominator."""
    kv_head = head // QUERY_GROUP  # grouped-query attention: QUERY_GROUP heads share K/V
    k_len = K.shape[2]
    qk_scale_log2, tanh_scale = score_factors(qk_scale, SOFTCAP, softcap)

    # Under the causal mask query row i sees keys j <= i + query_offset: 0 aligns the
    # diagonal top-left (SDPA's is_causal), k_len - q_len bottom-right (a KV-cache prefill).
    last_key = (q_tile * TILE_M + query_offset + ct.arange(TILE_M, dtype=ct.int32))[:, None]
    offs_n_in_tile = ct.arange(TILE_N, dtype=ct.int32)[None, :]

    m_i = ct.full((TILE_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32)
    if SINKS:  # the sink as if it were a key seen first: running max it, sum exp(0) = 1
        m_i = ct.full((TILE_M, 1), 0.0, dtype=ct.float32) + ct.gather(Sinks, head) * INV_LOG_2
        l_i = ct.full((TILE_M, 1), 1.0, dtype=ct.float32)
    acc = ct.full((TILE_M, TILE_DV), 0.0, dtype=ct.float32)

    q = ct.load(Q, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D))
    q_tail = q
    if TILE_D_TAIL > 0:
        q_tail = ct.load(Q, index=(batch, head, q_tile, TILE_D // TILE_D_TAIL),
                         shape=(1, 1, TILE_M, TILE_D_TAIL),
                         padding_mode=ct.PaddingMode.ZERO).reshape((TILE_M, TILE_D_TAIL))

    first_tile, whole_start, mask_start, num_k_tiles = key_tile_ranges(
        q_tile * TILE_M, (q_tile + 1) * TILE_M, k_len, query_offset, TILE_N, CAUSAL, WINDOW,
        window_left, window_right)
    tiles = (TILE_D, TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, CAUSAL)
    # WINDOW: a row may see none of a masked tile's keys; K and V are (batch, heads, keys, D)
    variants = (FP8, FMA_EXP2, SOFTCAP, tanh_scale, WINDOW, window_left, window_right, WINDOW,
                K, 0)
    shared = (Q, K, V, q, q_tail)
    where = (batch, kv_head, k_len, last_key, offs_n_in_tile, qk_scale_log2)
    if WINDOW:  # the tiles across the window's lower edge
        m_i, l_i, acc = attend(*shared, m_i, l_i, acc, first_tile, whole_start, *where, *tiles,
                               True, *variants)
    m_i, l_i, acc = attend(*shared, m_i, l_i, acc, whole_start, mask_start, *where, *tiles,
                           False, *variants)
    m_i, l_i, acc = attend(*shared, m_i, l_i, acc, max(mask_start, whole_start), num_k_tiles,
                           *where, *tiles, True, *variants)

    out = ct.truediv(acc, l_i, flush_to_zero=True, rounding_mode=ct.RoundingMode.APPROX)
    if FP8:
        out = out * v_scale
    if WINDOW:  # a row whose window holds no key: 0, not 0/0 (l_i >= 1 once it sees one)
        out = ct.where(l_i > 0.0, out, 0.0)
    if CAUSAL:
        # Rows whose diagonal falls before the first key (bottom-right alignment with more
        # queries than keys) see no key: their output is 0, not 0/0.
        sees_a_key = last_key >= 0
        out = ct.where(sees_a_key, out, 0.0)
    ct.store(Out, index=(batch, head, q_tile, 0),
             tile=out.reshape((1, 1, TILE_M, TILE_DV)).astype(Out.dtype))
    if WRITE_LSE:
        # Each row's log-sum-exp of its scaled scores, back from base 2 to natural log
        # (flash-attn's convention; -inf for a row that sees no key).
        lse = (m_i + ct.log2(l_i)) * LN_2
        if CAUSAL:
            if not SINKS:  # with sinks the row's LSE is its sink's
                lse = ct.where(sees_a_key, lse, -math.inf)
        ct.store(Lse, index=(batch, head, q_tile), tile=lse.reshape((1, 1, TILE_M)))


def block_of(K, BlockTable, batch, index):
    """Block `index` of sequence `batch` in a paged cache K, clamped to the cache (the table
    holds 0 past its end)."""
    return min(max(ct.gather(BlockTable, (batch, index)), 0), K.shape[0] - 1)


def score_factors(qk_scale, SOFTCAP: ConstBool, softcap):
    """(the factor that takes a raw product q.k to its score in base 2, the factor inside
    the softcap's tanh). With SOFTCAP the score is softcap * tanh(q.k * qk_scale / softcap):
    the tanh's argument takes qk_scale / softcap, and softcap is the base-2 factor, so the
    cap costs one multiply and one tanh per score."""
    qk_scale_log2 = qk_scale * INV_LOG_2
    tanh_scale = 0.0
    if SOFTCAP:
        tanh_scale = qk_scale / softcap
        qk_scale_log2 = softcap * INV_LOG_2
    return qk_scale_log2, tanh_scale


def key_tile_ranges(first_row, end_row, k_len, query_offset, TILE_N: ConstInt,
                    CAUSAL: ConstBool, WINDOW: ConstBool, window_left, window_right):
    """The key tiles the query rows first_row..end_row-1 (one query tile) see, in four bounds
    (first, whole_start, mask_start, end): tiles from mask_start to end-1 reach past the
    causal diagonal, the window's upper edge or the last key (masked); the ones from
    whole_start to mask_start-1 every row sees whole (no mask code); under WINDOW the ones
    from first to whole_start-1 cross the window's lower edge (masked), and the tiles
    below it are never loaded: a window of w keys costs O(w) per row. Without WINDOW
    first = whole_start = 0."""
    if CAUSAL:
        end = ct.cdiv(min(end_row + query_offset, k_len), TILE_N)
        mask_start = min((first_row + query_offset) // TILE_N, k_len // TILE_N)
    else:
        end = ct.cdiv(k_len, TILE_N)
        mask_start = k_len // TILE_N
    first, whole_start = 0, 0
    if WINDOW:
        first_row_key = first_row + query_offset  # the diagonal key of the first row
        last_row_key = end_row - 1 + query_offset
        if not CAUSAL:
            end = ct.cdiv(max(min(last_row_key + window_right + 1, k_len), 0), TILE_N)
            mask_start = min(max(first_row_key + window_right + 1, 0) // TILE_N,
                             k_len // TILE_N)
        first = max(first_row_key - window_left, 0) // TILE_N
        whole_start = min(max(ct.cdiv(max(last_row_key - window_left, 0), TILE_N), first), end)
    return first, whole_start, mask_start, end
