"""The backward pass's launches (kernels/backward.py), per architecture, as data.

Per head dim, the tile shape and worker warps of the dK/dV kernel and of the dQ kernel.
Only sm_90 has been looked at; every other architecture gets sm_90's launches, marked
unmeasured.
"""

from dataclasses import dataclass

from .entry import TileShape


@dataclass(frozen=True)
class BackwardLaunch:
    tiles: TileShape  # TILE_M query rows x TILE_N keys
    num_worker_warps: int | None  # None: the compiler's choice


@dataclass(frozen=True)
class BackwardEntry:
    launches: dict[int, dict[str, BackwardLaunch]]  # head dim -> "dkdv" / "dq" -> launch
    provenance: str


SM_90 = BackwardEntry(
    launches={
        64: {"dkdv": BackwardLaunch(TileShape(64, 64), 8),
             "dq": BackwardLaunch(TileShape(128, 64), 8)},
        128: {"dkdv": BackwardLaunch(TileShape(128, 64), 8),
              "dq": BackwardLaunch(TileShape(128, 64), 8)},
        256: {"dkdv": BackwardLaunch(TileShape(64, 64), 8),
              "dq": BackwardLaunch(TileShape(64, 64), 8)},
    },
    provenance="D=128: timed per kernel on an NVIDIA H100 80GB HBM3, 2026-11-22 (B=4, H=32, "
               "N=8192, fp16; docs/performance.md): dK/dV at 128x64 with eight worker warps "
               "took 9.0 / 16.6 ms (causal / not) against 9.8 / 19.4 at 64x128, though it "
               "keeps a 288-byte stack frame; dQ at 128x64 with eight worker warps was the "
               "fastest of six launches. D=64 and D=256: the launches that compiled for sm_90 "
               "with the least spilling (dK/dV at D=256 keeps 112 bytes: two float32 "
               "accumulators of 64 x 256), not yet timed.",
)
BACKWARD_ENTRIES = {"sm_90": SM_90}
DEFAULT_BACKWARD = BackwardEntry(SM_90.launches, "unmeasured: sm_90's launches")


def backward_entry_for(arch: str) -> BackwardEntry:
    return BACKWARD_ENTRIES.get(arch, DEFAULT_BACKWARD)
