"""What the autotuner (assets/fmha_autotune.py) tries on each architecture, as data.

Every combination of the tile shapes and hints below is one candidate launch. The sm_90
space is what an H100 sweep of 2026-11-22 narrowed down (measurements/): at D=64 and 128,
N=8192, no best launch had 32-row or 256-row tiles or num_worker_warps=4.
"""

import itertools
from dataclasses import dataclass

from .entry import TileShape, TunedLaunch


@dataclass(frozen=True)
class SearchSpace:
    tiles: tuple[TileShape, ...]
    occupancy: tuple[int, ...]
    num_worker_warps: tuple[int | None, ...]  # None: the compiler's choice
    num_ctas: tuple[int | None, ...]  # None: the compiler's choice

    def launches(self, step: int) -> list[TunedLaunch]:
        """Every candidate, for `step`."""
        return [TunedLaunch(step, tiles, occupancy, warps, ctas)
                for tiles, occupancy, warps, ctas in itertools.product(
                    self.tiles, self.occupancy, self.num_worker_warps, self.num_ctas)]


_SQUARE_TILES = (TileShape(64, 64), TileShape(64, 128), TileShape(128, 64), TileShape(128, 128))

SEARCH_SPACES = {
    "sm_90": SearchSpace(tiles=_SQUARE_TILES, occupancy=(1, 2), num_worker_warps=(None, 8),
                         num_ctas=(None, 2)),
}
DEFAULT_SEARCH_SPACE = SearchSpace(tiles=_SQUARE_TILES + (TileShape(256, 128),),
                                   occupancy=(1, 2), num_worker_warps=(None, 4, 8),
                                   num_ctas=(None,))


def search_space_for(arch: str) -> SearchSpace:
    return SEARCH_SPACES.get(arch, DEFAULT_SEARCH_SPACE)
