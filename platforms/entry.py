"""The shape of one platform-table entry."""

from dataclasses import dataclass
from typing import Literal

HEAD_DIMS = (64, 128, 256)
SOURCES = ("guide", "measured", "unmeasured")


@dataclass(frozen=True)
class TileShape:
    tile_m: int  # query rows per CTA
    tile_n: int  # key/value rows per loop iteration


@dataclass(frozen=True)
class PlatformEntry:
    arch: str  # "sm_90", or "default"
    gpus: str  # the GPUs this entry is for, in words
    tiles: dict[int, TileShape]  # head dim -> tile shape
    occupancy: int  # target CTAs per SM, given to the compiler from step 5 on
    source: Literal["guide", "measured", "unmeasured"]
    note: str  # where the numbers come from (device and date when measured)

    def tile_for(self, head_dim: int) -> TileShape:
        return self.tiles[head_dim]

    def describe(self) -> str:
        return f"{self.arch} ({self.gpus}), {self.source}: {self.note}"
