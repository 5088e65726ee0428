"""What the autotuner (assets/fmha_autotune.py) tries on each architecture, as data.

Every combination of the tile shapes and hints below is one candidate launch. The sm_90
space is what two H100 searches of 2026-11-22 narrowed down (measurements/): no best launch
had 32-row, 256-row or 64x64 tiles, num_worker_warps=4 or num_ctas=2. Its None (the
compiler's choice of worker warps) is still unmeasured for steps 7-9: in that search a
None left step 7's own 8 in place.
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


_64_TO_128 = (TileShape(64, 128), TileShape(128, 64), TileShape(128, 128))

SEARCH_SPACES = {
    "sm_90": SearchSpace(tiles=_64_TO_128, occupancy=(1, 2), num_worker_warps=(None, 8),
                         num_ctas=(None,)),
}
DEFAULT_SEARCH_SPACE = SearchSpace(tiles=(TileShape(64, 64),) + _64_TO_128 + (TileShape(256, 128),),
                                   occupancy=(1, 2), num_worker_warps=(None, 4, 8),
                                   num_ctas=(None, 2))


def search_space_for(arch: str) -> SearchSpace:
    return SEARCH_SPACES.get(arch, DEFAULT_SEARCH_SPACE)
