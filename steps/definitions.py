"""The tutorial's steps: which kernel each one runs and the idea it adds."""

from dataclasses import dataclass

from ..kernels import (step1_basic, step2_exp2, step3_load_order, step4_latency_hints,
                       step5_occupancy, step6_approx_div)


@dataclass(frozen=True)
class Step:
    number: int
    name: str  # what the step adds, as the tutorial's table shows it
    module: object  # the kernel's module; its docstring explains the idea
    # True from step 5 on: the kernel's occupancy comes from the platform table, so
    # running with another architecture's entry must override it too.
    uses_table_occupancy: bool

    @property
    def kernel(self):
        return self.module.fmha

    @property
    def source_file(self) -> str:
        return self.module.__file__


STEPS: dict[int, Step] = {
    step.number: step
    for step in (
        Step(1, "Basic cuTile", step1_basic, False),
        Step(2, "+ exp2", step2_exp2, False),
        Step(3, "+ Load order", step3_load_order, False),
        Step(4, "+ Latency hints", step4_latency_hints, False),
        Step(5, "+ Occupancy", step5_occupancy, True),
        Step(6, "+ Approx division", step6_approx_div, True),
    )
}
FINAL_STEP = max(STEPS)


def step_of(module) -> Step:
    """The step whose idea is the kernel module `module` (name steps by idea, not number)."""
    return next(step for step in STEPS.values() if step.module is module)
