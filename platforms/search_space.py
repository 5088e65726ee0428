"""What the autotuner (assets/fmha_autotune.py) tries on each architecture, as data.

Every combination of the tile shapes and hints below (and, for the FP8 forward, of its
shares of exponentials on the FMA pipes that the tile's columns allow) is one candidate
launch. The sm_90
space is what two H100 searches of 2026-11-22 narrowed down (measurements/): no best launch
had 32-row, 256-row or 64x64 tiles, num_worker_warps=4 or num_ctas=2. The compiler's own
choice of worker warps (None) stays: with 64x128 tiles it is the fastest launch at D=128
without the causal mask (measurements/sm_90-h100-2026-11-22-autotune.md).
"""

import dataclasses
import itertools
from dataclasses import dataclass

from .entry import TileShape, TunedLaunch, fma_exp2_fits


@dataclass(frozen=True)
class SearchSpace:
    tiles: tuple[TileShape, ...]
    occupancy: tuple[int, ...]
    num_worker_warps: tuple[int | None, ...]  # None: the compiler's choice
    num_ctas: tuple[int | None, ...]  # None: the compiler's choice
    fma_exp2: tuple[int, ...] = (0,)  # the FP8 forward's share of exponentials on FMA pipes

    def launches(self, step: int) -> list[TunedLaunch]:
        """Every candidate, for `step` (a share of exponentials on the FMA pipes only where
        the tile has as many columns: TunedLaunch.fma_exp2)."""
        return [TunedLaunch(step, tiles, occupancy, warps, ctas, fma_exp2)
                for tiles, occupancy, warps, ctas, fma_exp2 in itertools.product(
                    self.tiles, self.occupancy, self.num_worker_warps, self.num_ctas,
                    self.fma_exp2) if fma_exp2_fits(fma_exp2, tiles.tile_n)]


@dataclass(frozen=True)
class LargeHeadDimSearchSpace:
    """The candidates of steps 10-11 past D=256: every tile shape (tile_m, tile_n, tile_k)
    with every output slice (tile_v) from `narrowest_slice` up that divides the head dim."""
    space: SearchSpace
    narrowest_slice: int

    def launches(self, step: int, head_dim: int) -> list[TunedLaunch]:
        slices = [width for width in range(self.narrowest_slice, head_dim + 1, 64)
                  if head_dim % width == 0]
        return [dataclasses.replace(launch, tiles=dataclasses.replace(launch.tiles, tile_v=width))
                for launch in self.space.launches(step) for width in slices]


# Candidates whose stack frame (register spills) is larger are skipped without timing:
# kilobytes of spills are never fast. A few spilled registers can be: at D=256 without the
# causal mask, 128x128 tiles with eight worker warps spill two registers (8 bytes, an STL
# and an LDL per key tile, served by L1) and ran 4-6% faster than any launch without
# spills (measurements/sm_90-h100-2026-11-22-ideas.md).
MAX_STACK_BYTES = 64

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


# The FP8 forward (kernels/fp8.py), on every architecture that has it: float8 K and V tiles
# are half the bytes, so 256-key tiles fit in shared memory. (They were the only ones without
# spills at D=256 on sm_90 until the products accumulated in the tensor cores, 2026-11-27;
# since, 128x128 wins there: docs/performance.md, "FP8 forward".) Float8 products take half
# as long as 16-bit ones beside the same exponentials, so the search also moves one in 8 or
# 16 of them to the FMA pipes (TunedLaunch.fma_exp2): at D=128 on 128x256 tiles that ran
# 2-7% faster on an H200, at D=256 1.5-3.4% slower (docs/performance.md, "FP8 forward").
FP8_SEARCH_SPACE = SearchSpace(
    tiles=(TileShape(64, 64),) + _64_TO_128 + (TileShape(64, 256), TileShape(128, 256)),
    occupancy=(1, 2), num_worker_warps=(None, 8), num_ctas=(None,), fma_exp2=(0, 8, 16))


# Past D=256 (steps 10-11), on every architecture: TILE_M 64 (the accumulators of 64 rows
# by up to about 700 columns already fill the registers), one CTA per SM, eight worker
# warps (four ran 3-40% slower from D=768 on). Narrower slices than 256 columns recompute
# Q K^T in more CTAs than pays: at D=1024 slices of 256 ran at 150-155 TFLOPS against 193
# for 512 on an H100 (measurements/sm_90-h100-2026-11-22-large-head-dims.md).
LARGE_HEAD_DIM_SEARCH_SPACE = LargeHeadDimSearchSpace(
    SearchSpace(tiles=(TileShape(64, 64, tile_k=64), TileShape(64, 128, tile_k=64)),
                occupancy=(1,), num_worker_warps=(8,), num_ctas=(None,)),
    narrowest_slice=256)
