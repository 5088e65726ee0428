"""The shape of one platform-table entry."""

from dataclasses import dataclass, field
from typing import Literal

HEAD_DIMS = (64, 128, 256)
SOURCES = ("guide", "measured", "unmeasured")


@dataclass(frozen=True)
class TileShape:
    tile_m: int  # query rows per CTA
    tile_n: int  # key/value rows per loop iteration


@dataclass(frozen=True)
class TunedLaunch:
    """What the autotuner measured fastest on one GPU for one head dim, causal or not:
    the step, and the tiles and compiler hints every step from the first tuned one runs at."""
    step: int
    tiles: TileShape
    occupancy: int
    num_worker_warps: int | None = None  # None: the compiler's choice
    num_ctas: int | None = None  # None: the compiler's choice

    def hints(self) -> dict:
        """The ``@ct.kernel`` hints, for ``kernel.replace_hints`` (None replaces the kernel's
        own value with the compiler's choice)."""
        return {"occupancy": self.occupancy, "num_worker_warps": self.num_worker_warps,
                "num_ctas": self.num_ctas}


@dataclass(frozen=True)
class PlatformEntry:
    arch: str  # "sm_90", or "default"
    gpus: str  # the GPUs this entry is for, in words
    tiles: dict[int, TileShape]  # head dim -> tile shape of the guide's steps
    occupancy: int  # target CTAs per SM, given to the compiler from step 5 on
    source: Literal["guide", "measured", "unmeasured"]
    note: str  # where the numbers come from (device and date when measured)
    # Warps per CTA given to the compiler from step 7 on (num_worker_warps); None: its choice.
    worker_warps: int | None = None
    # (head dim, causal) -> the autotuner's result on this architecture (platforms/tuned/).
    tuned: dict[tuple[int, bool], TunedLaunch] = field(default_factory=dict)
    tuned_note: str = ""  # where the tuned launches were measured (device, date, versions)

    def tile_for(self, head_dim: int) -> TileShape:
        return self.tiles[head_dim]

    def describe(self) -> str:
        tuned = f"; tuned: {self.tuned_note}" if self.tuned else ""
        return f"{self.arch} ({self.gpus}), {self.source}: {self.note}{tuned}"
