"""Names shared by every step's kernel."""

import math

import cuda.tile as ct

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

# exp(x) == exp2(x * log2(e)): the factor that moves the softmax scale into base 2.
INV_LOG_2 = 1.0 / math.log(2)
LN_2 = math.log(2)  # and back: natural log == log2 * ln(2)

# What the K and V (or Q, dO and dQ) of one group of (head, batch) pairs may take of the
# L2 cache while the group's CTAs run tile by tile (``tile_major``).
L2_GROUP_BYTES = 16 * 2**20
# ... but a group holds at least this many CTAs, about a wave at one CTA per SM on a
# Hopper GPU (132 SMs): a group shorter than a wave starts its longest tiles beside the
# previous group's shortest, and the last wave waits on them (the causal dK/dV kernel
# with 4 or more query heads to a K/V head, whose pairs read 4x the bytes).
MIN_GROUP_CTAS = 128


def tile_major(pair_bytes):
    """(tile, head, batch) of this CTA in a grid of (tiles, heads, batch), numbered tile by
    tile over groups of (head, batch) pairs: tile 0 of every pair of a group, then tile 1,
    and so on. CTAs start in the order of their linear index (x fastest), so where tile 0
    carries the most work (the causal mask's longest tiles, put there by the caller) the
    longest tiles of the whole group start first and the last wave is short ones, not only
    within each pair. A group holds as many pairs as fit L2_GROUP_BYTES at `pair_bytes`
    each (what one pair's CTAs share in L2: its K and V, or its Q, dO and dQ), so that the
    CTAs running at once still share what they read, and at least MIN_GROUP_CTAS CTAs."""
    tiles, heads = ct.num_blocks(0), ct.num_blocks(1)
    pairs = heads * ct.num_blocks(2)
    linear = ct.bid(0) + tiles * (ct.bid(1) + heads * ct.bid(2))
    group = min(max(L2_GROUP_BYTES // max(pair_bytes, 1), ct.cdiv(MIN_GROUP_CTAS, tiles)),
                pairs)
    first_pair = linear // (group * tiles) * group
    in_group = min(group, pairs - first_pair)
    rest = linear - first_pair * tiles
    pair = first_pair + rest % in_group
    return rest // in_group, pair % heads, pair // heads


def kv_pair_bytes(k_rows, COLUMNS: ConstInt, QUERY_GROUP: ConstInt):
    """What the forward's or dQ's CTAs of one query head read from L2 (``tile_major``):
    k_rows rows of its K/V head's COLUMNS columns of 2 bytes (a float8 group is half as
    large as it could be), shared by QUERY_GROUP query heads."""
    return k_rows * COLUMNS * 2 // QUERY_GROUP


def query_tiles_longest_first(K, TILE_D: ConstInt, TILE_DV: ConstInt, QUERY_GROUP: ConstInt):
    """(q_tile, head, batch) of a causal forward or dQ CTA: ``tile_major``, the last query
    tiles (which see the most keys) first."""
    tile, head, batch = tile_major(kv_pair_bytes(K.shape[2], TILE_D + TILE_DV, QUERY_GROUP))
    return ct.num_blocks(0) - 1 - tile, head, batch
