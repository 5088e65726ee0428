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


# 2^f on [-1/2, 1/2] as a quadratic fitted for the least relative error (1.73e-3, far under
# float8 e4m3's rounding of P, 2^-4). With the nearest integer of x added to the result's
# exponent bits it gives 2^x on the FMA and integer pipes instead of the multi-function
# unit's MUFU.EX2 (FlashAttention-4's split of the softmax's exponentials). The integer
# comes from adding 1.5 * 2^23 (the float add rounds it into the low mantissa bits), not
# from a float-to-int conversion, which would run at MUFU's rate.
EXP2_QUADRATIC = (1.00044284, 0.70343972, 0.23842415)
ROUNDING_MAGIC = 12582912.0  # 1.5 * 2^23
ROUNDING_MAGIC_BITS = 0x4B400000


def exp2_on_fma(x):
    """2^x to a relative 1.73e-3 for finite x (below -126 about 1e-38 where exp2 gives 0)."""
    x = ct.maximum(x, -126.0)
    rounded = x + ROUNDING_MAGIC
    whole = ct.bitcast(rounded, ct.int32) - ROUNDING_MAGIC_BITS
    f = x - (rounded - ROUNDING_MAGIC)
    c0, c1, c2 = EXP2_QUADRATIC
    fraction = c0 + f * (c1 + f * c2)
    return ct.bitcast(ct.bitcast(fraction, ct.int32) + (whole << 23), ct.float32)


def joined(parts, AXIS: ConstInt):
    """`parts` (a tuple of 2^k tiles of one shape) concatenated along AXIS in order, in
    pairs: a tile's sizes must be powers of two."""
    for _ in ct.static_iter(range(len(parts).bit_length() - 1)):
        pairs = ()
        for i in ct.static_iter(range(len(parts) // 2)):
            pairs += (ct.cat((parts[2 * i], parts[2 * i + 1]), AXIS),)
        parts = pairs
    return parts[0]


def exp2_split(x, FMA_EXP2: ConstInt):
    """2^x of a finite 2-D tile, one column in FMA_EXP2 (a power of two from 2 up to its
    columns) by ``exp2_on_fma``, the others by MUFU.EX2: the first half of the columns is
    halved again until the share is reached."""
    rows, half = x.shape[0], x.shape[1] // 2
    first = ct.extract(x, (0, 0), shape=(rows, half))
    if FMA_EXP2 == 2:
        first = exp2_on_fma(first)
    else:
        first = exp2_split(first, FMA_EXP2 // 2)
    second = ct.exp2(ct.extract(x, (0, 1), shape=(rows, half)), flush_to_zero=True)
    return ct.cat((first, second), 1)
