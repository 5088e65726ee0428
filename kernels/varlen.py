"""Variable-length batches: each sequence its own rows of Q, K and V, found from its bounds.

A batch of sequences of different lengths comes two ways: packed end to end with no
padding (flash-attn's ``cu_seqlens``: one batch row holding every sequence) or padded to
one length (a batch row per sequence, its tokens somewhere inside it: left or right
padding). Both are a (batch rows, heads, rows, D) array and, per sequence s, the first and
one-past-last row of its queries and of its keys (QueryStarts[s], QueryEnds[s], ...; under
CUMULATIVE_BOUNDS the starts are flash-attn's cumulative lengths themselves, one entry per
sequence and one more, and sequence s ends where s + 1 starts); a sequence lives in batch
row s, or in row 0 when the array has only one.

One CTA per (query tile, head, sequence) reads those four numbers, takes views of Q, K, V,
Out and Lse that start at the sequence and end with it (``Array.slice``: no copy, the
loads stay TMA loads and see zero past the sequence's last row; the CTA writes their
tensor maps itself, so the dK/dV kernel reads its key tile, loaded once, by plain loads),
and runs the dense kernel's own code on them: the forward is ``attend_query_tile`` of
step 9 (past D=256, of step 10 or 11), the backward the dK/dV and dQ tiles of
kernels/backward.py. Under CAUSAL each sequence's diagonal is aligned to its last key
(bottom right, as flash-attn aligns varlen batches). A sequence with no keys gives zeros
and an LSE of -inf.

The grid is sized from the longest sequence the caller names, one tile per CTA: the last
CTA of a row writes NaN to the tiles past the grid (the output and its LSE in the forward,
the gradients in the backward), so a max_seqlen below the truth gives NaN, never silently
wrong results. (A forward CTA that strode through its sequence's tiles by the grid's width
hung on sm_90 at D=64 under tileiras 13.4; in the backward the same loop spilled 400-850
bytes per thread at D=128: docs/performance.md.) Under CAUSAL the CTAs take their tiles as
the dense kernels do (``tile_major``): the longest tile of every (head, sequence) pair of a
group first. Bounds are clamped to the arrays: bounds that are wrong give wrong rows, never
a read or write outside the tensors.
"""

import math

import cuda.tile as ct

from ..platforms import occupancy_by_target, worker_warps_by_target
from . import step10_head_dim_tiling as head_dim_tiling
from . import step11_resident_query as resident_query
from .backward import add_query_rows, dkdv_key_tile, dkdv_pair_bytes, dq_query_tile
from .common import ConstBool, ConstInt, kv_pair_bytes, tile_major
from .step9_unmasked_loop import attend_query_tile
from .step10_head_dim_tiling import output_chunks


def sequence_bounds(Starts, Ends, sequence, rows, CUMULATIVE: ConstBool):
    """The sequence's first row and its number of rows, clamped to an axis of `rows` rows;
    its end is Ends[sequence], or under CUMULATIVE Starts[sequence + 1] (Ends is then not
    an array). The first row of an empty sequence may be one before its start: a slice
    must start inside the array, and an empty one starts anywhere."""
    start = max(ct.gather(Starts, sequence), 0)
    end = ct.gather(Starts, sequence + 1) if CUMULATIVE else ct.gather(Ends, sequence)
    length = max(min(end, rows) - start, 0)
    return min(start, max(rows - 1, 0)), length


def sequence_view(X, sequence, start, length):
    """Rows start..start+length-1 (axis 2) of X's batch row `sequence` (axis 0; its only
    one when X holds every sequence packed in one row), as an array of one batch row."""
    batch = min(sequence, X.shape[0] - 1)
    return X.slice(0, batch, batch + 1).slice(2, start, start + length)


def one_batch_row(X, RANK: ConstInt):
    """X as (batch rows, heads, rows[, D]) of rank RANK: X itself, or a packed
    (tokens, heads[, D]) array of one rank less seen as its one batch row (made here, the
    view costs the host nothing; an as_strided view per array cost each call 2 us). The
    batch axis has one row, so its stride is never used: X's own first stride, which the
    host checked, stands for it (tokens x that stride could pass 32 bits)."""
    if X.ndim == RANK:
        return X
    if RANK == 4:
        return ct.Array.from_foreign(X.foreign_pointer, (1, X.shape[1], X.shape[0], X.shape[2]),
                                     (X.strides[0], X.strides[1], X.strides[0], X.strides[2]))
    return ct.Array.from_foreign(X.foreign_pointer, (1, X.shape[0], X.shape[1]),
                                 (X.strides[0], X.strides[0], X.strides[1]))


def forward_views(Q, K, V, Out, Lse, QueryStarts, QueryEnds, KeyStarts, KeyEnds, sequence,
                  WRITE_LSE: ConstBool, CUMULATIVE_BOUNDS: ConstBool):
    """The forward's arrays as views of one sequence, and its query and key counts. A
    packed batch may pass Q, K, V and Out as (tokens, heads, D) and Lse as (heads,
    tokens): the packed tensors themselves."""
    Q, K, V, Out = one_batch_row(Q, 4), one_batch_row(K, 4), one_batch_row(V, 4), \
        one_batch_row(Out, 4)
    if WRITE_LSE:
        Lse = one_batch_row(Lse, 3)
    q_start, q_len = sequence_bounds(QueryStarts, QueryEnds, sequence, Q.shape[2],
                                     CUMULATIVE_BOUNDS)
    k_start, k_len = sequence_bounds(KeyStarts, KeyEnds, sequence, K.shape[2],
                                     CUMULATIVE_BOUNDS)
    Q = sequence_view(Q, sequence, q_start, q_len)
    Out = sequence_view(Out, sequence, q_start, q_len)
    if WRITE_LSE:  # else Lse is a placeholder of one element
        Lse = sequence_view(Lse, sequence, q_start, q_len)
    K = sequence_view(K, sequence, k_start, k_len)
    V = sequence_view(V, sequence, k_start, k_len)
    return Q, K, V, Out, Lse, q_len, k_len


def fill_query_tile(Out, Lse, head, q_tile, out_slice, value, lse_value, TILE_M: ConstInt,
                    TILE_D: ConstInt, TILE_V: ConstInt, WRITE_LSE: ConstBool):
    """`value` in this CTA's TILE_V output columns of a query tile and `lse_value` in its
    LSE: zeros and -inf for a sequence with no keys (flash-attn's convention), NaN for a
    tile past the grid."""
    if TILE_V < TILE_D:
        first_column = out_slice * TILE_V
        Out = Out.slice(3, first_column, first_column + TILE_V)
    for offset, width in ct.static_iter(output_chunks(TILE_V)):
        ct.store(Out, index=(0, head, q_tile, offset // width),
                 tile=ct.full((1, 1, TILE_M, width), value, dtype=Out.dtype))
    if WRITE_LSE:
        if out_slice == 0:
            ct.store(Lse, index=(0, head, q_tile),
                     tile=ct.full((1, 1, TILE_M), lse_value, dtype=ct.float32))


def fill_past_the_grid(Out, Lse, head, tile, num_tiles, num_q_tiles, out_slice,
                       TILE_M: ConstInt, TILE_D: ConstInt, TILE_V: ConstInt,
                       CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    """NaN in the output and LSE of the sequence's query tiles that the grid's `num_tiles`
    CTAs of a row do not reach, written by the last of them (`tile`)."""
    if tile == num_tiles - 1:
        for missing in range(tile + 1, num_q_tiles):
            q_tile = num_q_tiles - 1 - missing if CAUSAL else missing
            fill_query_tile(Out, Lse, head, q_tile, out_slice, math.nan, math.nan, TILE_M,
                            TILE_D, TILE_V, WRITE_LSE)


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha(Q, K, V, Out, Lse, Sinks, QueryStarts, QueryEnds, KeyStarts, KeyEnds,
         qk_scale: float, softcap: float, window_left: int, window_right: int,
         TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt, TILE_M: ConstInt,
         TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool, WRITE_LSE: ConstBool,
         SOFTCAP: ConstBool, WINDOW: ConstBool, SINKS: ConstBool,
         CUMULATIVE_BOUNDS: ConstBool):
    """Up to D=256: step 9's query tile, with the variants of kernels/variants.py (a
    window aligned to each sequence's last key, as the causal mask)."""
    tile, head, sequence = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:  # every sequence's and head's longest tiles first, as the dense kernels;
        # a pair's rows counted as the longest sequence's (the grid's tiles)
        tile, head, sequence = tile_major(kv_pair_bytes(
            ct.num_blocks(0) * TILE_M, TILE_D + TILE_D_TAIL + TILE_DV, QUERY_GROUP))
    Q, K, V, Out, Lse, q_len, k_len = forward_views(Q, K, V, Out, Lse, QueryStarts, QueryEnds,
                                                    KeyStarts, KeyEnds, sequence, WRITE_LSE,
                                                    CUMULATIVE_BOUNDS)
    num_q_tiles = ct.cdiv(q_len, TILE_M)
    no_keys = k_len == 0
    if SINKS:  # every row's weight is its sink's: the key loop gives 0 and the sink's LSE
        no_keys = k_len < 0
    if tile < num_q_tiles:
        q_tile = num_q_tiles - 1 - tile if CAUSAL else tile  # longest first, as step 8
        if no_keys:
            fill_query_tile(Out, Lse, head, q_tile, 0, 0.0, -math.inf, TILE_M, TILE_DV,
                            TILE_DV, WRITE_LSE)
        else:
            attend_query_tile(Q, K, V, Out, Lse, 0, head, q_tile, qk_scale, k_len - q_len,
                              TILE_D, TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP,
                              CAUSAL, WRITE_LSE, False, 1.0, 0, SOFTCAP, softcap, WINDOW,
                              window_left, window_right, SINKS, Sinks)
    fill_past_the_grid(Out, Lse, head, tile, ct.num_blocks(0), num_q_tiles, 0, TILE_M, TILE_DV,
                       TILE_DV, CAUSAL, WRITE_LSE)


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha_tiled_head_dim(Q, K, V, Out, Lse, QueryStarts, QueryEnds, KeyStarts, KeyEnds,
                        qk_scale: float, TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt,
                        QUERY_GROUP: ConstInt, CAUSAL: ConstBool, TILE_K: ConstInt,
                        TILE_V: ConstInt, WRITE_LSE: ConstBool, RESIDENT_QUERY: ConstBool,
                        CUMULATIVE_BOUNDS: ConstBool):
    """Past D=256: step 10's query tile, or with RESIDENT_QUERY step 11's, D / TILE_V CTAs
    side by side per query tile as in their dense grid."""
    head, sequence = ct.bid(1), ct.bid(2)
    slices = TILE_D // TILE_V
    out_slice = ct.bid(0) % slices
    Q, K, V, Out, Lse, q_len, k_len = forward_views(Q, K, V, Out, Lse, QueryStarts, QueryEnds,
                                                    KeyStarts, KeyEnds, sequence, WRITE_LSE,
                                                    CUMULATIVE_BOUNDS)
    num_q_tiles = ct.cdiv(q_len, TILE_M)
    tile = ct.bid(0) // slices
    if tile < num_q_tiles:
        q_tile = num_q_tiles - 1 - tile if CAUSAL else tile
        if k_len == 0:
            fill_query_tile(Out, Lse, head, q_tile, out_slice, 0.0, -math.inf, TILE_M, TILE_D,
                            TILE_V, WRITE_LSE)
        elif RESIDENT_QUERY:
            resident_query.attend_query_tile(Q, K, V, Out, Lse, 0, head, q_tile, out_slice,
                                             qk_scale, k_len - q_len, TILE_D, TILE_M, TILE_N,
                                             QUERY_GROUP, CAUSAL, TILE_K, TILE_V, WRITE_LSE)
        else:
            head_dim_tiling.attend_query_tile(Q, K, V, Out, Lse, 0, head, q_tile, out_slice,
                                              qk_scale, k_len - q_len, TILE_D, TILE_M, TILE_N,
                                              QUERY_GROUP, CAUSAL, TILE_K, TILE_V, WRITE_LSE)
    fill_past_the_grid(Out, Lse, head, tile, ct.num_blocks(0) // slices, num_q_tiles, out_slice,
                       TILE_M, TILE_D, TILE_V, CAUSAL, WRITE_LSE)


def store_nan(X, head, row_tile, ROWS: ConstInt, TILE_D: ConstInt, TILE_D_TAIL: ConstInt):
    """NaN in rows row_tile * ROWS.. of a gradient of one sequence that the grid has no CTA
    for (``tiles_per_sequence``): its TILE_D columns and the TILE_D_TAIL after them."""
    ct.store(X, index=(0, head, row_tile, 0),
             tile=ct.full((1, 1, ROWS, TILE_D), math.nan, dtype=X.dtype))
    if TILE_D_TAIL > 0:
        ct.store(X, index=(0, head, row_tile, TILE_D // TILE_D_TAIL),
                 tile=ct.full((1, 1, ROWS, TILE_D_TAIL), math.nan, dtype=X.dtype))


def backward_views(Q, K, V, dO, Lse, Delta, QueryStarts, QueryEnds, KeyStarts, KeyEnds,
                   sequence, CUMULATIVE_BOUNDS: ConstBool):
    """The backward's inputs as views of one sequence, and its query and key bounds."""
    q_start, q_len = sequence_bounds(QueryStarts, QueryEnds, sequence, Q.shape[2],
                                     CUMULATIVE_BOUNDS)
    k_start, k_len = sequence_bounds(KeyStarts, KeyEnds, sequence, K.shape[2],
                                     CUMULATIVE_BOUNDS)
    return (sequence_view(Q, sequence, q_start, q_len), sequence_view(K, sequence, k_start, k_len),
            sequence_view(V, sequence, k_start, k_len), sequence_view(dO, sequence, q_start, q_len),
            sequence_view(Lse, sequence, q_start, q_len),
            sequence_view(Delta, sequence, q_start, q_len), q_start, q_len, k_start, k_len)


def add_nan(dQAcc, kv_head, q_len, TILE_M: ConstInt, TILE_D: ConstInt, TILE_D_TAIL: ConstInt,
            QUERY_GROUP: ConstInt):
    """NaN added to every dQ row of one sequence's query heads of a K/V head: some of its
    key tiles have no CTA (``tiles_per_sequence``), so their dQ shares are missing."""
    for step in range(QUERY_GROUP * ct.cdiv(q_len, TILE_M)):
        head = kv_head * QUERY_GROUP + step % QUERY_GROUP
        q_tile = step // QUERY_GROUP
        add_query_rows(dQAcc, ct.full((TILE_M, TILE_D), math.nan, dtype=ct.float32), 0, head,
                       q_tile, TILE_M, TILE_D)
        if TILE_D_TAIL > 0:
            add_query_rows(dQAcc, ct.full((TILE_M, TILE_D_TAIL), math.nan, dtype=ct.float32),
                           0, head, q_tile, TILE_M, TILE_D_TAIL, TILE_D // TILE_D_TAIL)


@ct.kernel
def dkdv(Q, K, V, dO, Lse, Delta, dK, dV, dQAcc, QueryStarts, QueryEnds, KeyStarts, KeyEnds,
         qk_scale: float, softcap: float, window_left: int, window_right: int,
         TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt, TILE_M: ConstInt,
         TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool, SOFTCAP: ConstBool,
         WINDOW: ConstBool, ATOMIC_DQ: ConstBool, ADD_TO_DKDV: ConstBool, DQ_LATE: ConstBool,
         CUMULATIVE_BOUNDS: ConstBool):
    k_tile, kv_head, sequence = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:  # key tile 0 sees the most queries
        k_tile, kv_head, sequence = tile_major(dkdv_pair_bytes(
            ct.num_blocks(0) * TILE_N, TILE_D + TILE_D_TAIL, TILE_DV, QUERY_GROUP, ATOMIC_DQ))
    Q, K, V, dO, Lse, Delta, q_start, q_len, k_start, k_len = backward_views(
        Q, K, V, dO, Lse, Delta, QueryStarts, QueryEnds, KeyStarts, KeyEnds, sequence,
        CUMULATIVE_BOUNDS)
    dK = sequence_view(dK, sequence, k_start, k_len)
    dV = sequence_view(dV, sequence, k_start, k_len)
    if ATOMIC_DQ:
        dQAcc = sequence_view(dQAcc, sequence, q_start, q_len)
    num_k_tiles = ct.cdiv(k_len, TILE_N)
    if k_tile < num_k_tiles:
        dkdv_key_tile(Q, K, V, dO, Lse, Delta, dK, dV, dQAcc, 0, kv_head, k_tile, qk_scale,
                      k_len - q_len, TILE_D, TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP,
                      CAUSAL, SOFTCAP, softcap, WINDOW, window_left, window_right, ATOMIC_DQ,
                      DQ_LATE, ADD_TO_DKDV, False)
    if k_tile == ct.num_blocks(0) - 1:
        for missing in range(k_tile + 1, num_k_tiles):
            store_nan(dK, kv_head, missing, TILE_N, TILE_D, TILE_D_TAIL)
            store_nan(dV, kv_head, missing, TILE_N, TILE_DV, 0)
        if ATOMIC_DQ and k_tile + 1 < num_k_tiles:
            add_nan(dQAcc, kv_head, q_len, TILE_M, TILE_D, TILE_D_TAIL, QUERY_GROUP)


@ct.kernel
def dq(Q, K, V, dO, Lse, Delta, dQ, Out, QueryStarts, QueryEnds, KeyStarts, KeyEnds,
       qk_scale: float, softcap: float, window_left: int, window_right: int,
       TILE_D: ConstInt, TILE_D_TAIL: ConstInt, TILE_DV: ConstInt, TILE_M: ConstInt,
       TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool, SOFTCAP: ConstBool,
       WINDOW: ConstBool, DELTA_FROM_OUT: ConstBool, CUMULATIVE_BOUNDS: ConstBool):
    tile, head, sequence = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:
        tile, head, sequence = tile_major(kv_pair_bytes(
            ct.num_blocks(0) * TILE_M, TILE_D + TILE_D_TAIL + TILE_DV, QUERY_GROUP))
    Q, K, V, dO, Lse, Delta, q_start, q_len, k_start, k_len = backward_views(
        Q, K, V, dO, Lse, Delta, QueryStarts, QueryEnds, KeyStarts, KeyEnds, sequence,
        CUMULATIVE_BOUNDS)
    dQ = sequence_view(dQ, sequence, q_start, q_len)
    if DELTA_FROM_OUT:
        Out = sequence_view(Out, sequence, q_start, q_len)
    num_q_tiles = ct.cdiv(q_len, TILE_M)
    if tile < num_q_tiles:
        q_tile = num_q_tiles - 1 - tile if CAUSAL else tile  # longest first
        dq_query_tile(Q, K, V, dO, Lse, Delta, dQ, Out, 0, head, q_tile, qk_scale,
                      k_len - q_len, TILE_D, TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP,
                      CAUSAL, SOFTCAP, softcap, WINDOW, window_left, window_right,
                      DELTA_FROM_OUT)
    if tile == ct.num_blocks(0) - 1:
        for missing in range(tile + 1, num_q_tiles):
            q_tile = num_q_tiles - 1 - missing if CAUSAL else missing
            store_nan(dQ, head, q_tile, TILE_M, TILE_D, TILE_D_TAIL)
