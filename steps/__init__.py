"""The tutorial's steps and the one launcher that runs any of them.

    from cutile_fmha.steps import attention
    out = attention(q, k, v, causal=True)            # the fastest step
    out = attention(q, k, v, causal=True, step=1)    # the basic kernel
"""

from .definitions import FINAL_STEP, STEPS, Step
from .launcher import LaunchPlan, attention, plan_launch

__all__ = ["FINAL_STEP", "STEPS", "Step", "LaunchPlan", "attention", "plan_launch"]
