"""Decoding from a KV cache: a few new query rows per sequence against a long cache.

Decoding is bound by memory, not by the tensor cores: each step reads the whole cache
once and does two multiply-adds per byte. So the kernel's shape follows the bytes:

- One CTA per (split, K/V head, sequence) reads each K/V tile once for every query head
  of the group that shares it (grouped-query attention): the group's heads and the query
  rows are one tile of GROUP_TILE x QUERY_ROWS columns.
- The products run transposed, S^T = K Q^T and O^T = V^T P^T: the cache tile (TILE_N
  keys, or the head dim) is the matrix product's M side, so a group of 4 heads of one
  query row uses a 64- or 128-row warpgroup product fully, not one padded from 4 rows.
  From 64 columns (QUERIES_ON_M) they fill the M side themselves: the products run as
  step 9's, S = Q K^T and O = P V, with step 9's key loop, so the softmax reduces along
  each thread's rows instead of across the warps. V is then the products' shared-memory
  operand, which cannot take rows zeroed in registers, so the TMA loads give zeros past
  the sequence instead: a dense cache is viewed from the sequence's first key to its last
  (``sequence_keys``); a paged one reads the tile that holds the last key, a block at a
  time where a tile spans several, through a view whose blocks end where the sequence's
  last block does (``ending_blocks``).
- Split-KV (flash-decoding): with few sequences and heads, the keys of each sequence are
  cut into ct.num_blocks(0) chunks, each CTA writes its chunk's normalised output and
  log-sum-exp to float32 buffers, and ``merge_splits`` combines them. With one split the
  CTA writes the output itself (SPLIT=False). The merge is a programmatic dependent
  launch on sm_90 and later: its CTAs start as the splits do and wait on the GPU for
  them, so no launch gap separates the two kernels.
- The cache is dense, (batch, kv_heads, capacity, D) as transformers keeps it, or paged
  (PAGED): (blocks, BLOCK_SIZE, kv_heads, D), sequence b's key p in block
  BlockTable[b, p // BLOCK_SIZE], each block's rows a TMA load of its own (a tile of
  several blocks: a product per block and matrix on the M side, and for two blocks of 64
  keys or more in the transposed products; smaller blocks joined there).
- Sequence b's keys are KeyStarts[b] (HAS_STARTS; else 0) to KeyEnds[b]-1 (HAS_LENGTHS;
  else the whole capacity). Under CAUSAL its query row t sees keys up to KeyEnds[b] - q_len + t: the
  new tokens are the cache's last ones.

The variants of kernels/variants.py are constants here too: SOFTCAP (the scores through a
tanh), WINDOW (each query row sees window_left keys before its diagonal, last_key below,
the diagonal window_right keys past the causal one; the key tiles below every row's window
are not this sequence's tiles at all, so the splits share the window only) and SINKS
(each head's sink joins the first split's running max and sum, as a key seen first; the
merge weighs it with that split).

Only the tiles at the ends of a sequence (KeyStarts not on a tile boundary or below the
window, the last keys, the causal diagonal) run mask code. Their V rows outside the
sequence are zeroed too (on the M side, read as zeros): a cache's unused slots may hold
anything, NaN included, and 0 * NaN is NaN. Page numbers
are clamped to the cache, so a block table entry past a sequence's end is never a read
outside it.
"""

import math

import cuda.tile as ct

from . import step9_unmasked_loop as step9
from .common import INV_LOG_2, LN_2, ConstBool, ConstInt, joined
from .step9_unmasked_loop import score_factors

ZERO = ct.PaddingMode.ZERO


def key_range(KeyStarts, KeyEnds, batch, capacity, HAS_STARTS: ConstBool,
              HAS_LENGTHS: ConstBool):
    """The sequence's first key and one past its last, clamped to the cache."""
    end = min(max(ct.gather(KeyEnds, batch), 0), capacity) if HAS_LENGTHS else capacity
    start = min(max(ct.gather(KeyStarts, batch), 0), end) if HAS_STARTS else 0
    return start, end


def sequence_keys(Cache, batch, start, end):
    """A dense cache's keys start..end-1 of sequence `batch`, as an array of one batch row
    (1, kv_heads, end - start, D) whose TMA loads see zeros past them: the tiles past the
    sequence's last key need no V rows zeroed (a cache's unused slots may hold NaN). The
    CTA writes its tensor maps; an empty slice starts inside the cache (or at 0 in a cache
    with no slots, as kernels/varlen.py's)."""
    first = min(start, max(Cache.shape[2] - 1, 0))
    return Cache.slice(0, batch, batch + 1).slice(2, first, first + end - start)


def ending_blocks(Cache, end, BLOCK_SIZE: ConstInt):
    """A paged cache (blocks, BLOCK_SIZE, kv_heads, D) whose blocks each end where the
    sequence's last one does (a sequence of `end` keys): the TMA loads of the tile that
    holds its last key see zeros past it, so no V row needs zeroing in registers (a
    block's unused rows may hold NaN). The CTA writes its tensor maps; at least one row."""
    last_block_start = (max(end, 1) - 1) // BLOCK_SIZE * BLOCK_SIZE
    return Cache.slice(1, 0, max(end - last_block_start, 1))


def load_block_rows(Cache, BlockTable, batch, kv_head, first_key, ROWS: ConstInt,
                    COLUMNS: ConstInt, COLUMN_TILE: ConstInt, BLOCK_SIZE: ConstInt):
    """ROWS keys of a paged cache from first_key on, all in one block: (ROWS, COLUMNS),
    the head dim's columns COLUMN_TILE * COLUMNS on."""
    block = step9.block_of(Cache, BlockTable, batch, first_key // BLOCK_SIZE)
    return ct.load(Cache, index=(block, (first_key % BLOCK_SIZE) // ROWS, kv_head, COLUMN_TILE),
                   shape=(1, ROWS, 1, COLUMNS), padding_mode=ZERO,
                   latency=4).reshape((ROWS, COLUMNS))


def load_cache_tile(Cache, BlockTable, batch, kv_head, tile, TILE_N: ConstInt,
                    COLUMNS: ConstInt, COLUMN_TILE: ConstInt, PAGED: ConstBool,
                    BLOCK_SIZE: ConstInt):
    """Keys tile * TILE_N.. of one sequence and K/V head, (TILE_N, COLUMNS) from column
    COLUMN_TILE * COLUMNS on, zero past the cache. A paged tile spans TILE_N // BLOCK_SIZE
    blocks (at most 8), each its own TMA load (Hopper's TMA has no gather), joined."""
    if not PAGED:
        return ct.load(Cache, index=(batch, kv_head, tile, COLUMN_TILE),
                       shape=(1, 1, TILE_N, COLUMNS), padding_mode=ZERO,
                       latency=4).reshape((TILE_N, COLUMNS))
    rows = min(TILE_N, BLOCK_SIZE)
    blocks = ()
    for b in ct.static_iter(range(TILE_N // rows)):
        blocks += (load_block_rows(Cache, BlockTable, batch, kv_head, tile * TILE_N + b * rows,
                                   rows, COLUMNS, COLUMN_TILE, BLOCK_SIZE),)
    return joined(blocks, 0)


def load_tile_rows(Cache, BlockTable, batch, kv_head, tile, offset, ROWS: ConstInt,
                   TILE_N: ConstInt, COLUMNS: ConstInt, COLUMN_TILE: ConstInt,
                   PAGED: ConstBool, BLOCK_SIZE: ConstInt):
    """(ROWS, COLUMNS) of key tile `tile` from its row `offset` on (the whole tile, ROWS =
    TILE_N, or one block of it), from column COLUMN_TILE * COLUMNS on."""
    if ROWS == TILE_N:
        return load_cache_tile(Cache, BlockTable, batch, kv_head, tile, TILE_N, COLUMNS,
                               COLUMN_TILE, PAGED, BLOCK_SIZE)
    return load_block_rows(Cache, BlockTable, batch, kv_head, tile * TILE_N + offset, ROWS,
                           COLUMNS, COLUMN_TILE, BLOCK_SIZE)


def column_pieces(TILE: ConstInt, TAIL: ConstInt):
    """The (columns, column tile) of K's loads on a TILE-wide tile, each its own product
    into S^T: the whole tile, or with TAIL its first half and TAIL columns after it (zero
    past the head dim). A load's columns past the tensor's cost its TMA load as if read: a
    (128, 128) tile of an 80-column cache read at 81% of the HBM peak, as (128, 64) and
    (128, 16) tiles at 89% (H100, docs/performance.md). V keeps one load: its pieces, as
    products of 16 rows or joined with ct.cat, went through registers and lost."""
    if TAIL == 0:
        return ((TILE, 0),)
    return ((TILE // 2, 0), (TAIL, TILE // 2 // TAIL))


def tile_scores(K, BlockTable, q_parts, tile, offset, batch, kv_head, start, end, last_key,
                tanh_scale, window_left, ROWS: ConstInt, TILE_N: ConstInt, TILE_D: ConstInt,
                D_TAIL: ConstInt, CAUSAL: ConstBool, PAGED: ConstBool, BLOCK_SIZE: ConstInt,
                SOFTCAP: ConstBool, WINDOW: ConstBool, MASKED: ConstBool):
    """(S^T of key tile `tile`'s ROWS keys from `offset` on (ROWS, M), under MASKED -inf
    where a column does not see the key; which of the keys are the sequence's, (ROWS, 1),
    or None)."""
    s = ct.full((ROWS, q_parts[0].shape[1]), 0.0, dtype=ct.float32)
    for i, (columns, column_tile) in ct.static_iter(enumerate(column_pieces(TILE_D, D_TAIL))):
        k = load_tile_rows(K, BlockTable, batch, kv_head, tile, offset, ROWS, TILE_N, columns,
                           column_tile, PAGED, BLOCK_SIZE)
        s = ct.mma(k, q_parts[i], s)
    if SOFTCAP:
        s = ct.tanh(s * tanh_scale, rounding_mode=ct.RoundingMode.APPROX)
    in_sequence = None
    if MASKED:
        keys = (tile * TILE_N + offset + ct.arange(ROWS, dtype=ct.int32))[:, None]
        in_sequence = (keys >= start) & (keys < end)
        visible = in_sequence & (keys <= last_key) if CAUSAL else in_sequence
        if WINDOW:
            visible = visible & (keys >= last_key - window_left)
        s = ct.where(visible, s, -math.inf)
    return s, in_sequence


def add_values(V, BlockTable, p, acc, tile, offset, in_sequence, batch, kv_head,
               ROWS: ConstInt, TILE_N: ConstInt, TILE_DV: ConstInt, PAGED: ConstBool,
               BLOCK_SIZE: ConstInt, MASKED: ConstBool):
    """acc + V^T P^T over key tile `tile`'s ROWS keys from `offset` on (under MASKED, V rows
    outside the sequence zeroed: a cache's unused slots may hold NaN)."""
    v = load_tile_rows(V, BlockTable, batch, kv_head, tile, offset, ROWS, TILE_N, TILE_DV, 0,
                       PAGED, BLOCK_SIZE)
    if MASKED:
        v = ct.where(in_sequence, v, 0.0)
    return ct.mma(ct.transpose(v), p.astype(v.dtype), acc)


def attend(K, V, BlockTable, q_parts, m, l, acc, first_tile, end_tile, batch, kv_head, start,
           end, last_key, qk_scale_log2, tanh_scale, window_left, TILE_D: ConstInt,
           TILE_DV: ConstInt, D_TAIL: ConstInt, TILE_N: ConstInt,
           CAUSAL: ConstBool, PAGED: ConstBool, BLOCK_SIZE: ConstInt, SOFTCAP: ConstBool,
           WINDOW: ConstBool, MASKED: ConstBool):
    """Key tiles first_tile..end_tile-1 into the running column statistics (m, l: (1, M))
    and acc (TILE_DV, M); with MASKED, keys outside start..end-1, past each column's
    `last_key` and (WINDOW) more than window_left before it count for nothing.
    A paged tile of two blocks of at least 64 keys (a warpgroup product's M side each) runs
    as two products per matrix, each on its block's own TMA load: joined with ct.cat, the
    blocks went through registers (LDSM) and took shared memory from the load pipeline."""
    halves = PAGED and TILE_N == 2 * BLOCK_SIZE and BLOCK_SIZE >= 64
    rows = TILE_N // 2 if halves else TILE_N
    keys = (K, BlockTable, q_parts)
    where = (batch, kv_head, start, end, last_key, tanh_scale, window_left, rows, TILE_N,
             TILE_D, D_TAIL, CAUSAL, PAGED, BLOCK_SIZE, SOFTCAP, WINDOW, MASKED)
    values = (batch, kv_head, rows, TILE_N, TILE_DV, PAGED, BLOCK_SIZE, MASKED)
    for j in range(first_tile, end_tile):
        s, in_sequence = tile_scores(*keys, j, 0, *where)
        tile_max = ct.max(s, axis=0, keepdims=True)
        if halves:
            s_upper, in_upper = tile_scores(*keys, j, rows, *where)
            tile_max = ct.maximum(tile_max, ct.max(s_upper, axis=0, keepdims=True))
        m_new = ct.maximum(m, tile_max * qk_scale_log2)
        # A column that has seen no key yet keeps m = -inf: subtract 0 there, not -inf.
        m_used = ct.where(m_new == -math.inf, 0.0, m_new)
        p = ct.exp2(s * qk_scale_log2 - m_used, flush_to_zero=True)
        alpha = ct.exp2(m - m_used, flush_to_zero=True)
        l = l * alpha + ct.sum(p, axis=0, keepdims=True)
        acc = add_values(V, BlockTable, p, acc * alpha, j, 0, in_sequence, *values)
        if halves:
            p_upper = ct.exp2(s_upper * qk_scale_log2 - m_used, flush_to_zero=True)
            l = l + ct.sum(p_upper, axis=0, keepdims=True)
            acc = add_values(V, BlockTable, p_upper, acc, j, rows, in_upper, *values)
        m = m_new
    return m, l, acc


def attend_rows(Q, K, V, BlockTable, q, split, lo, unmasked_lo, unmasked_hi, hi, batch,
                kv_head, end, diagonal, column, qk_scale_log2, tanh_scale, window_left, sink_log2,
                TILE_D: ConstInt, TILE_DV: ConstInt, TILE_N: ConstInt, QUERY_ROWS: ConstInt,
                CAUSAL: ConstBool, PAGED: ConstBool, BLOCK_SIZE: ConstInt, SOFTCAP: ConstBool,
                WINDOW: ConstBool, SINKS: ConstBool):
    """(m, l: (M, 1); acc: (M, TILE_DV)) of the M columns of q (M, TILE_D) as rows, over key
    tiles lo..hi-1 of one sequence's `end` keys, by step 9's key loop: the tiles from
    unmasked_lo to unmasked_hi - 1 every row sees whole. Row c is column c of the
    transposed kernel: its last key is diagonal + c % QUERY_ROWS. K, V: the sequence's
    keys (``sequence_keys``), or under PAGED the paged cache, a tile one block or part of
    one, or several blocks (step 9's BLOCK_ROWS), the tile that holds the last key read
    through ``ending_blocks``."""
    columns = q.shape[0]
    last_key = (diagonal + column % QUERY_ROWS)[:, None]
    m = ct.full((columns, 1), -math.inf, dtype=ct.float32)
    l = ct.full((columns, 1), 0.0, dtype=ct.float32)
    if SINKS:
        first_split = (ct.full((columns, 1), 0, dtype=ct.int32) + split) == 0
        m = ct.where(first_split, sink_log2, m)
        l = ct.where(first_split, 1.0, l)
    acc = ct.full((columns, TILE_DV), 0.0, dtype=ct.float32)
    keys = ct.arange(TILE_N, dtype=ct.int32)[None, :]
    # The masked tiles up to head_end and tail_end; under PAGED the tile past them, which
    # holds rows past the last key (none when the sequence ends on a tile boundary), after.
    head_end, tail_end, ragged, sequence, block_rows = unmasked_lo, hi, hi, 0, 0
    if PAGED:
        ragged, sequence, block_rows = end // TILE_N, batch, BLOCK_SIZE
        head_end, tail_end = min(unmasked_lo, ragged), min(hi, ragged)
    # No key right of the last: the window's right side is the causal mask (or none).
    seen, scores = (sequence, kv_head, end, last_key), (qk_scale_log2, TILE_D, 0, TILE_DV, columns)
    where = seen + (keys,) + scores + (TILE_N, CAUSAL)
    variants = (False, 0, SOFTCAP, tanh_scale, WINDOW, window_left, 1 << 30, True)
    pages = (BlockTable, block_rows)
    m, l, acc = step9.attend(Q, K, V, q, q, m, l, acc, lo, head_end, *where, True, *variants,
                             *pages)
    m, l, acc = step9.attend(Q, K, V, q, q, m, l, acc, unmasked_lo, unmasked_hi, *where, False,
                             *variants, *pages)
    m, l, acc = step9.attend(Q, K, V, q, q, m, l, acc, unmasked_hi, tail_end, *where, True,
                             *variants, *pages)
    if PAGED:
        # In units of a block where blocks are shorter than tiles: its whole blocks from
        # the cache, the last through ending_blocks.
        unit = min(TILE_N, BLOCK_SIZE)
        units_per_tile = TILE_N // unit
        first, last = max(lo, ragged) * units_per_tile, (max(end, 1) - 1) // unit
        stop = min(hi * units_per_tile, ct.cdiv(end, unit))
        where = seen + (ct.arange(unit, dtype=ct.int32)[None, :],) + scores + (unit, CAUSAL)
        if units_per_tile > 1:
            m, l, acc = step9.attend(Q, K, V, q, q, m, l, acc, first, min(stop, last), *where,
                                     True, *variants, *pages)
        m, l, acc = step9.attend(Q, ending_blocks(K, end, BLOCK_SIZE),
                                 ending_blocks(V, end, BLOCK_SIZE), q, q, m, l, acc,
                                 max(first, last), stop, *where, True, *variants, *pages)
    return m, l, acc


def normalized(m, l, acc):
    """(acc / l, the base-2 log-sum-exp m + log2(l)) of the running statistics: a column
    that saw no key (an empty split or sequence, a causal row before the first key) gives
    0 and -inf."""
    seen = l > 0.0
    return (ct.where(seen, ct.truediv(acc, ct.where(seen, l, 1.0)), 0.0),
            ct.where(seen, m + ct.log2(ct.where(seen, l, 1.0)), -math.inf))


@ct.kernel
def decode(Q, K, V, Out, Lse, Partial, PartialLse, KeyStarts, KeyEnds, BlockTable, Sinks,
           qk_scale: float, softcap: float, window_left: int, window_right: int,
           TILE_D: ConstInt, TILE_DV: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
           GROUP_TILE: ConstInt, QUERY_ROWS: ConstInt, CAUSAL: ConstBool, PAGED: ConstBool,
           BLOCK_SIZE: ConstInt, HAS_STARTS: ConstBool, HAS_LENGTHS: ConstBool, SPLIT: ConstBool,
           WRITE_LSE: ConstBool, SOFTCAP: ConstBool, WINDOW: ConstBool, SINKS: ConstBool,
           QUERIES_ON_M: ConstBool, COLUMN_TILES: ConstInt, D_TAIL: ConstInt):
    """Q: (batch, heads, q_len, D), Out: (batch, heads, q_len, D_v), any strides; Lse:
    (batch, heads, q_len) float32; Partial, PartialLse: (batch, kv_heads, splits, M, D_v)
    and (.., M) float32 with M = GROUP_TILE * QUERY_ROWS (written instead of Out and Lse
    under SPLIT); Sinks: (heads,) float32 under SINKS. TILE_D and TILE_DV: Q's and K's,
    and V's, tile widths, powers of two at least D and D_v: the loads give zeros past a
    head dim's last column and the stores leave those columns out (D=96 runs 128).
    QUERIES_ON_M: the columns are the products' M side, S = Q K^T, and the key loop is step
    9's (``attend_rows``); paged, only with keys from 0 (not HAS_STARTS: a block's rows
    before a sequence's first key would be read as keys). COLUMN_TILES: the columns are cut
    into this many CTAs' tiles (a long chunk of new tokens), each seeing the keys up to its
    own last row's; grid dimension 0 is column tile x split."""
    split, kv_head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if SPLIT:  # the merge's CTAs may start now, and wait on the GPU for this grid's end
        ct.grid_dependency_control_launch_dependents()
    column_tile, split = split % COLUMN_TILES, split // COLUMN_TILES
    splits = ct.num_blocks(0) // COLUMN_TILES
    q_len = Q.shape[2]
    columns = GROUP_TILE * QUERY_ROWS // COLUMN_TILES
    # The query rows of this tile's columns: all, or where a tile holds part of one head's
    # rows, a run of them. The CTAs take those runs last rows first, the heads side by side:
    # under CAUSAL the last rows see the most keys (step 8's longest tiles first).
    first_row = 0
    tile_is_query = True
    if columns < QUERY_ROWS:
        row_tiles = QUERY_ROWS // columns
        column_tile = column_tile % GROUP_TILE * row_tiles + \
            (row_tiles - 1 - column_tile // GROUP_TILE)
        first_row = column_tile % row_tiles * columns
        tile_is_query = (first_row < q_len) & (column_tile // row_tiles < QUERY_GROUP)
    last_row = min(first_row + min(columns, QUERY_ROWS), q_len) - 1
    capacity = BlockTable.shape[1] * BLOCK_SIZE if PAGED else K.shape[2]
    start, end = key_range(KeyStarts, KeyEnds, batch, capacity, HAS_STARTS, HAS_LENGTHS)

    # Column c is query row c % QUERY_ROWS of the group's head c // QUERY_ROWS. Q is a few
    # rows, gathered (any layout, any group size); the cache is what is streamed.
    column = column_tile * columns + ct.arange(columns, dtype=ct.int32)
    head, query_row = (kv_head * QUERY_GROUP + column // QUERY_ROWS)[:, None], \
        (column % QUERY_ROWS)[:, None]
    is_query = (column // QUERY_ROWS < QUERY_GROUP)[:, None] & (query_row < q_len)
    dims = ct.arange(TILE_D, dtype=ct.int32)[None, :]
    q = ct.gather(Q, (batch, head, query_row, dims), mask=is_query)
    if QUERIES_ON_M and not PAGED:  # the sequence's own keys, counted from its first
        K, V = sequence_keys(K, batch, start, end), sequence_keys(V, batch, start, end)
        start, end = 0, end - start

    # Row t's diagonal, the last key it sees under CAUSAL, is diagonal + t: the new tokens
    # are the cache's last. Under WINDOW it moves window_right keys on: a window bounded on
    # the right without a causal mask runs as a causal one (steps/decode.py).
    diagonal = end - q_len
    if WINDOW:
        diagonal = diagonal + window_right
    # This split's share of the sequence's key tiles, and which of them need no mask: from
    # the first key a row sees (its start, or under WINDOW the first row's window) to the
    # last (under CAUSAL the last row's diagonal) and, on the lower side, from the last key
    # below every row's window.
    lowest, whole_from, seen_end = start, start, end
    if WINDOW:
        lowest = max(start, diagonal + first_row - window_left)
        whole_from = max(start, diagonal + last_row - window_left)
    if CAUSAL:
        seen_end = max(min(diagonal + last_row + 1, end), lowest)
    first_tile = lowest // TILE_N
    num_tiles = ct.cdiv(seen_end, TILE_N) - first_tile
    if not tile_is_query:  # rows past q_len, or heads past the group: no keys to read
        num_tiles = 0
    per_split = ct.cdiv(num_tiles, splits)
    lo = first_tile + min(split * per_split, num_tiles)
    hi = first_tile + min((split + 1) * per_split, num_tiles)
    unmasked_lo = min(max(ct.cdiv(whole_from, TILE_N), lo), hi)
    visible_end = end  # keys every row of the tile sees, from its first
    if CAUSAL:
        visible_end = diagonal + first_row + 1
        if WINDOW:
            visible_end = min(visible_end, end)
    unmasked_hi = max(min(visible_end // TILE_N, hi), unmasked_lo)

    qk_scale_log2, tanh_scale = score_factors(qk_scale, SOFTCAP, softcap)
    sink_log2 = 0.0
    if SINKS:  # the sink as a key the first split saw first: running max it, sum exp(0) = 1
        sink_log2 = ct.gather(Sinks, head, mask=is_query) * INV_LOG_2
    if QUERIES_ON_M:
        m, l, acc = attend_rows(Q, K, V, BlockTable, q, split, lo, unmasked_lo, unmasked_hi, hi,
                                batch, kv_head, end, diagonal, column, qk_scale_log2, tanh_scale,
                                window_left, sink_log2, TILE_D, TILE_DV, TILE_N, QUERY_ROWS,
                                CAUSAL, PAGED, BLOCK_SIZE, SOFTCAP, WINDOW, SINKS)
        out, lse_log2 = normalized(m, l, acc)
        lse_log2 = ct.transpose(lse_log2)
    else:
        last_key = (diagonal + column % QUERY_ROWS)[None, :]
        m = ct.full((1, columns), -math.inf, dtype=ct.float32)
        l = ct.full((1, columns), 0.0, dtype=ct.float32)
        if SINKS:
            first_split = (ct.full((1, columns), 0, dtype=ct.int32) + split) == 0
            m = ct.where(first_split, ct.transpose(sink_log2), m)
            l = ct.where(first_split, 1.0, l)
        acc = ct.full((TILE_DV, columns), 0.0, dtype=ct.float32)
        q_t = ct.transpose(q)
        q_parts = tuple(ct.extract(q_t, (piece, 0), (width, columns))
                        for width, piece in ct.static_iter(column_pieces(TILE_D, D_TAIL)))
        shared = (K, V, BlockTable)
        settings = (batch, kv_head, start, end, last_key, qk_scale_log2, tanh_scale,
                    window_left, TILE_D, TILE_DV, D_TAIL, TILE_N, CAUSAL, PAGED, BLOCK_SIZE,
                    SOFTCAP, WINDOW)
        m, l, acc = attend(*shared, q_parts, m, l, acc, lo, unmasked_lo, *settings, True)
        m, l, acc = attend(*shared, q_parts, m, l, acc, unmasked_lo, unmasked_hi, *settings, False)
        m, l, acc = attend(*shared, q_parts, m, l, acc, unmasked_hi, hi, *settings, True)
        out, lse_log2 = normalized(m, l, acc)
        out = ct.transpose(out)
    if SPLIT:
        ct.store(Partial, index=(batch, kv_head, split, column_tile, 0),
                 tile=out.reshape((1, 1, 1, columns, TILE_DV)))
        ct.store(PartialLse, index=(batch, kv_head, split, column_tile),
                 tile=lse_log2.reshape((1, 1, 1, columns)))
    else:
        value_dims = ct.arange(TILE_DV, dtype=ct.int32)[None, :]
        ct.scatter(Out, (batch, head, query_row, value_dims), out.astype(Out.dtype),
                   mask=is_query)
        if WRITE_LSE:
            ct.scatter(Lse, (batch, head, query_row), (lse_log2 * LN_2).reshape((columns, 1)),
                       mask=is_query)


@ct.kernel
def merge_splits(Partial, PartialLse, Out, Lse, TILE_DV: ConstInt, SPLITS_TILE: ConstInt,
                 QUERY_GROUP: ConstInt, QUERY_ROWS: ConstInt, WRITE_LSE: ConstBool):
    """One query row of one head: the splits' outputs weighted by their share of the
    softmax denominator, exp2(lse_split - lse) (Out, Lse and the buffers as in decode)."""
    row, kv_head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    ct.grid_dependency_control_wait()  # launched early (programmatic): the splits' writes
    q_len = Out.shape[2]
    head_in_group, query_row = row // q_len, row % q_len
    column = head_in_group * QUERY_ROWS + query_row
    lse = ct.gather(PartialLse, (batch, kv_head, ct.arange(SPLITS_TILE, dtype=ct.int32), column),
                    padding_value=-math.inf)
    partial = ct.load(Partial, index=(batch, kv_head, 0, column, 0),
                      shape=(1, 1, SPLITS_TILE, 1, TILE_DV), padding_mode=ZERO)
    largest = ct.max(lse)
    largest = ct.where(largest == -math.inf, 0.0, largest)
    weights = ct.exp2(lse - largest, flush_to_zero=True)
    total = ct.sum(weights)
    seen = total > 0.0
    out = ct.sum(partial.reshape((SPLITS_TILE, TILE_DV)) * weights[:, None], axis=0)
    out = ct.where(seen, out / ct.where(seen, total, 1.0), 0.0)
    head = kv_head * QUERY_GROUP + head_in_group
    ct.store(Out, index=(batch, head, query_row, 0),
             tile=out.reshape((1, 1, 1, TILE_DV)).astype(Out.dtype))
    if WRITE_LSE:
        log_sum = ct.where(seen, (largest + ct.log2(ct.where(seen, total, 1.0))) * LN_2,
                           -math.inf)
        ct.store(Lse, index=(batch, head, query_row), tile=log_sum.reshape((1, 1, 1)))
