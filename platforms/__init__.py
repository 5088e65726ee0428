"""Platform tables: which tile sizes and occupancy each GPU architecture gets.

The table itself is data (``table.py``); this module looks entries up and turns the
occupancy column into the ``ct.ByTarget`` value that the kernels' decorators use.
"""

import cuda.tile as ct

from .entry import (HEAD_DIMS, LARGE_HEAD_DIMS, DecodeLaunch, PlatformEntry, TileShape,
                    TunedLaunch)
from .table import DEFAULT, PLATFORMS

__all__ = ["HEAD_DIMS", "LARGE_HEAD_DIMS", "PLATFORMS", "DEFAULT", "DecodeLaunch", "PlatformEntry",
           "TileShape",
           "TunedLaunch", "entry_for", "occupancy_by_target", "worker_warps_by_target",
           "arch_of_capability"]


def arch_of_capability(major: int, minor: int) -> str:
    """(9, 0) -> "sm_90", the spelling cuTile and the tables use."""
    return f"sm_{major}{minor}"


def entry_for(arch: str) -> PlatformEntry:
    """The table's entry for `arch` ("sm_90", ...), or the default entry."""
    if not isinstance(arch, str) or not (arch == "default" or arch.startswith("sm_")):
        raise ValueError(f"platform must be an architecture name such as 'sm_90' or "
                         f"'default', got {arch!r}")
    return PLATFORMS.get(arch, DEFAULT)


def occupancy_by_target() -> ct.ByTarget:
    """The occupancy column as ``ct.ByTarget(sm_121=2, sm_103=1, ..., default=1)``."""
    return ct.ByTarget(default=DEFAULT.occupancy,
                       **{arch: entry.occupancy for arch, entry in PLATFORMS.items()})


def worker_warps_by_target() -> ct.ByTarget:
    """The worker-warps column as ``ct.ByTarget(sm_90=8)``: architectures without a value
    leave it to the compiler."""
    return ct.ByTarget(**{arch: entry.worker_warps for arch, entry in PLATFORMS.items()
                          if entry.worker_warps is not None})
