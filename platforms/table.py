"""Per-architecture launch parameters, as data.

Each entry says which tile shape the launcher uses for each head-dim class, how many
CTAs per SM the compiler should aim for (``occupancy``), and where the numbers come
from. Only entries whose ``source`` is ``"measured"`` or ``"guide"`` were timed on that
architecture; the others are starting points for whoever owns such a GPU.
"""

import dataclasses

from .entry import PlatformEntry, TileShape, TunedLaunch
from .tuned import load_tuned

_64x64 = TileShape(tile_m=64, tile_n=64)
_64x128 = TileShape(tile_m=64, tile_n=128)
_128x64 = TileShape(tile_m=128, tile_n=64)
_128x128 = TileShape(tile_m=128, tile_n=128)
_256x128 = TileShape(tile_m=256, tile_n=128)
# sm_80 and sm_89 (no warpgroup MMA, no TMA) share one guess.
_MMA_SYNC_GUESS = ("Conservative guess (mma.sync, no TMA): small tiles, 2 CTAs/SM; not timed. "
                   "cuobjdump shows spills at 64x64 (stack 496 to 1512 bytes; on sm_80 every "
                   "shape tried spills at D>=128): time it before trusting it.")

# Past D=256 where the autotuner has not measured a launch per head dim: step 10 (Q
# streamed, so its shared memory does not grow with D) at 64x64 tiles, the head dim in
# chunks of 64 and output slices up to 704 columns wide (large_head_dim_launch): a starting
# point, not timed as a rule; on sm_90 the autotuner's launches replace it (tuned/).
_LARGE_HEAD_DIM_RULE = TunedLaunch(step=10, tiles=TileShape(64, 64, tile_k=64, tile_v=704),
                                   occupancy=1, num_worker_warps=8)

_ENTRIES = (
    PlatformEntry(
        arch="sm_121",
        gpus="DGX Spark (GB10)",
        tiles={64: _64x64, 128: _64x64, 256: _64x64},
        occupancy=2,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="guide",
        note="The guide's DGX Spark row: small tiles, 2 CTAs/SM for its 48 SMs.",
    ),
    PlatformEntry(
        arch="sm_103",
        gpus="B300",
        tiles={64: _256x128, 128: _256x128, 256: _128x128},
        occupancy=1,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="guide",
        note="The guide's B300 row (256x128, occupancy 1) for D=64/128; D=256 takes "
             "the guide's alternate 128x128 (unmeasured) to keep the accumulator small.",
    ),
    PlatformEntry(
        arch="sm_100",
        gpus="B200, GB200",
        tiles={64: _256x128, 128: _256x128, 256: _128x128},
        occupancy=1,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="unmeasured",
        note="Copied from the B300 (sm_103) entry: same SM design, not timed.",
    ),
    PlatformEntry(
        arch="sm_120",
        gpus="RTX PRO 6000 Blackwell, GeForce RTX 50",
        tiles={64: _64x64, 128: _64x64, 256: _64x64},
        occupancy=2,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="unmeasured",
        note="Copied from the DGX Spark (sm_121) entry: same SM design, not timed.",
    ),
    PlatformEntry(
        arch="sm_90",
        gpus="H100, H200",
        tiles={64: _64x128, 128: _64x128, 256: _64x128},
        occupancy=2,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="measured",
        note="Measured on an NVIDIA H200, 2026-11-21, with the tile sweep (step 6, B=4, "
             "N=4096, fp16; measurements/): 64x128 at occupancy 2 is the best mean of "
             "causal and non-causal for D=64, 128 and 256. TILE_M=128 spills at D=256 "
             "(2584-byte stack frame in cuobjdump). Worker warps 8: measured on an H100, "
             "2026-11-22 (measurements/), with 128-row tiles at occupancy 1.",
        worker_warps=8,
    ),
    PlatformEntry(
        arch="sm_89",
        gpus="L4, L40S, RTX 40",
        tiles={64: _64x64, 128: _64x64, 256: _64x64},
        occupancy=2,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="unmeasured",
        note=_MMA_SYNC_GUESS,
    ),
    PlatformEntry(
        arch="sm_80",
        gpus="A100, A30",
        tiles={64: _64x64, 128: _64x64, 256: _64x64},
        occupancy=2,
        large_head_dim=_LARGE_HEAD_DIM_RULE,
        source="unmeasured",
        note=_MMA_SYNC_GUESS,
    ),
)
# Each entry with what the autotuner measured on its architecture, where it has run.
PLATFORMS: dict[str, PlatformEntry] = {
    entry.arch: dataclasses.replace(entry, **load_tuned(entry.arch)) for entry in _ENTRIES
}

DEFAULT = PlatformEntry(
    arch="default",
    gpus="any other GPU cuTile supports",
    tiles={64: _64x64, 128: _64x64, 256: _64x64},
    occupancy=1,
    large_head_dim=_LARGE_HEAD_DIM_RULE,
    source="unmeasured",
    note="Fallback for architectures without an entry: small tiles, occupancy 1; not timed.",
)
