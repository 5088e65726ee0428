"""The causal kernels' CTA order (kernels/common.py's tile_major), run as plain Python: its
arithmetic is integers only, so with the block index and grid size of each CTA handed in
it can be checked on a CPU for every CTA of a grid."""

import itertools
import math
from types import SimpleNamespace

import pytest

from cutile_fmha.kernels import common


def numbered(monkeypatch, grid: tuple[int, int, int], pair_bytes: int | None = None,
             order_of=None) -> list[tuple]:
    """Each CTA's (tile, head, batch), in launch order (x fastest): tile_major's at
    `pair_bytes`, or `order_of()`'s."""
    order = []
    for batch, head, tile in itertools.product(*(range(n) for n in reversed(grid))):
        block = (tile, head, batch)
        monkeypatch.setattr(common, "ct", SimpleNamespace(bid=lambda axis: block[axis],
                                                          num_blocks=lambda axis: grid[axis],
                                                          cdiv=lambda a, b: -(-a // b)))
        order.append(order_of() if order_of else common.tile_major(pair_bytes))
    return order


@pytest.mark.parametrize("grid", [(16, 4, 4), (7, 3, 5), (1, 1, 1), (5, 1, 9), (64, 3, 2),
                                  (200, 2, 3)])
@pytest.mark.parametrize("pairs_per_group", [1, 3, 4, 1000])
def test_every_tile_of_every_pair_once_tile_by_tile_within_each_group(monkeypatch, grid,
                                                                      pairs_per_group):
    tiles, heads, batches = grid
    order = numbered(monkeypatch, grid, common.L2_GROUP_BYTES // pairs_per_group)
    assert sorted(order) == sorted(itertools.product(range(tiles), range(heads),
                                                     range(batches)))
    # as many pairs as fit the L2 budget, but at least a wave of CTAs
    group = min(max(pairs_per_group, math.ceil(common.MIN_GROUP_CTAS / tiles)), heads * batches)
    for start in range(0, len(order), group * tiles):
        ctas = order[start:start + group * tiles]
        pair_count = len(ctas) // tiles
        # tile 0 of each pair of the group, then tile 1, ...
        assert [tile for tile, _, _ in ctas] == [t for t in range(tiles)
                                                 for _ in range(pair_count)]
        assert len({(head, batch) for _, head, batch in ctas}) == pair_count


def test_a_small_problem_is_one_group_and_a_large_one_keeps_each_head_together(monkeypatch):
    small = numbered(monkeypatch, (4, 2, 2), pair_bytes=1)
    assert [tile for tile, _, _ in small[:4]] == [0] * 4  # every pair's longest tile first
    tiles = common.MIN_GROUP_CTAS
    large = numbered(monkeypatch, (tiles, 2, 2), pair_bytes=common.L2_GROUP_BYTES + 1)
    assert large == [(t, h, b) for b in range(2) for h in range(2) for t in range(tiles)]


def test_pairs_past_the_l2_budget_still_group_a_wave_of_ctas(monkeypatch):
    """The Llama demo's dK/dV (16 key tiles, 4 K/V heads x batch 4, each pair's Q and dO 4 MB
    with 4 query heads to a K/V head): groups of 8 pairs, 128 CTAs, not the 4 that fit 16 MB;
    so every pair's longest tile starts before any pair's fourth."""
    order = numbered(monkeypatch, (16, 4, 4), pair_bytes=4 * 2**20)
    assert [tile for tile, _, _ in order[:8]] == [0] * 8
    assert [tile for tile, _, _ in order[:32]] == [t for t in range(4) for _ in range(8)]


def test_query_tiles_start_from_the_last_which_sees_the_most_keys(monkeypatch):
    keys = SimpleNamespace(shape=(2, 4, 1024, 128))
    order = numbered(monkeypatch, (8, 4, 2),
                     order_of=lambda: common.query_tiles_longest_first(keys, 128, 128, 1))
    assert [q_tile for q_tile, _, _ in order[:8]] == [7] * 8  # all 8 pairs' last tile
    assert sorted(order) == sorted(itertools.product(range(8), range(4), range(2)))
