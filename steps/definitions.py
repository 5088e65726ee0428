"""The tutorial's steps: which kernel each one runs, the idea it adds, and where its launch
configuration (tile shape and compiler hints) comes from."""

from dataclasses import dataclass
from typing import Literal

from ..kernels import (step1_basic, step2_exp2, step3_load_order, step4_latency_hints,
                       step5_occupancy, step6_approx_div, step7_worker_warps, step8_heavy_first,
                       step9_unmasked_loop, step10_head_dim_tiling,
                       step11_resident_query)
from ..platforms import HEAD_DIMS, LARGE_HEAD_DIMS, PlatformEntry, TileShape, TunedLaunch
from .family import FORWARD, FORWARD_TILED_HEAD_DIM, KernelFamily

# Where a step's launch configuration comes from:
#   "guide": the platform entry's tile shape; the kernel's own hints (none).
#   "table": the same, and the occupancy hint, which the kernel takes from the platform
#            table; so running with another architecture's entry must bring its occupancy.
#   "tuned": per head dim and causal or not, the tiles and hints the autotuner measured
#            fastest on this architecture (platforms/tuned/); without them, as "table",
#            or past D=256 the entry's rule (PlatformEntry.tuned_launch).
LaunchSource = Literal["guide", "table", "tuned"]


@dataclass(frozen=True)
class Step:
    number: int
    name: str  # what the step adds, as the tutorial's table shows it
    module: object  # the kernel's module; its docstring explains the idea
    launch: LaunchSource
    head_dims: tuple[int, ...] = HEAD_DIMS  # the head dims it runs
    family: KernelFamily = FORWARD  # how its kernel is called (steps/family.py)

    @property
    def kernel(self):
        return self.module.fmha

    @property
    def source_file(self) -> str:
        return self.module.__file__

    def launch_config(self, entry: PlatformEntry, *, native: bool, head_dim: int,
                      causal: bool) -> tuple[TileShape, dict | None]:
        """(tiles, hints) for one launch with `entry`: hints to replace on the kernel, or
        None to run it as decorated. `native`: `entry` is the one of the architecture the
        kernel is compiled for, whose values the kernel's ByTarget hints already hold."""
        tuned = entry.tuned_launch(head_dim, causal) if self.launch == "tuned" else None
        if tuned is not None:
            return tuned.tiles, tuned.hints()
        if self.launch == "guide" or native:
            return entry.tile_for(head_dim), None
        hints = {"occupancy": entry.occupancy}
        if self.launch == "tuned" and entry.worker_warps is not None:
            hints["num_worker_warps"] = entry.worker_warps
        return entry.tile_for(head_dim), hints


STEPS: dict[int, Step] = {
    step.number: step
    for step in (
        Step(1, "Basic cuTile", step1_basic, "guide"),
        Step(2, "+ exp2", step2_exp2, "guide"),
        Step(3, "+ Load order", step3_load_order, "guide"),
        Step(4, "+ Latency hints", step4_latency_hints, "guide"),
        Step(5, "+ Occupancy", step5_occupancy, "table"),
        Step(6, "+ Approx division", step6_approx_div, "table"),
        Step(7, "+ Worker warps", step7_worker_warps, "tuned"),
        Step(8, "+ Heaviest first", step8_heavy_first, "tuned"),
        Step(9, "+ Unmasked loop", step9_unmasked_loop, "tuned"),
        Step(10, "+ Head-dim tiling", step10_head_dim_tiling, "tuned", LARGE_HEAD_DIMS,
             FORWARD_TILED_HEAD_DIM),
        Step(11, "+ Resident query", step11_resident_query, "tuned", LARGE_HEAD_DIMS,
             FORWARD_TILED_HEAD_DIM),
    )
}
FINAL_STEP = max(STEPS)


def step_of(module) -> Step:
    """The step whose idea is the kernel module `module` (name steps by idea, not number)."""
    return next(step for step in STEPS.values() if step.module is module)


# The guide's last step: what runs where the autotuner has not measured which step is fastest.
GUIDE_FINAL_STEP = step_of(step6_approx_div).number
# The step whose query tile (``attend_query_tile``) the variable-length, FP8 and variants
# kernels run up to D=256, and so whose launch they take where the autotuner has not
# measured one of their own.
QUERY_TILE_STEP = step_of(step9_unmasked_loop).number


def steps_for(head_dim: int, among=None) -> list[int]:
    """The steps that run at `head_dim`: those of `among`, in its order, or every one."""
    return [number for number in (sorted(STEPS) if among is None else among)
            if head_dim in STEPS[number].head_dims]


def launch_of(entry: PlatformEntry, tuned: TunedLaunch | None, step: int, *, head_dim: int,
              causal: bool) -> tuple[TileShape, dict | None]:
    """(tiles, hints) of a kernel on a step's code: `tuned` (the autotuner's launch of that
    kernel) where there is one, else the step's own launch with `entry` (as compiled for
    it: native)."""
    if tuned is not None:
        return tuned.tiles, tuned.hints()
    return STEPS[step].launch_config(entry, native=True, head_dim=head_dim, causal=causal)


def fastest_step(entry: PlatformEntry, head_dim: int, causal: bool) -> int:
    """The step the autotuner measured fastest with `entry` (past D=256 without one, the
    step of the entry's rule), else the guide's last step."""
    tuned = entry.tuned_launch(head_dim, causal)
    return tuned.step if tuned is not None else GUIDE_FINAL_STEP
