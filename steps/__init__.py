"""The tutorial's steps and the one launcher that runs any of them.

    from cutile_fmha.steps import attention
    out = attention(q, k, v, causal=True)            # the fastest step on this GPU
    out = attention(q, k, v, causal=True, step=1)    # the basic kernel
    plan = plan_launch(q, k, v, causal="bottom_right", with_lse=True)  # plan.lse after launch()
"""

from .definitions import FINAL_STEP, STEPS, Step, steps_for
from .launcher import CAUSAL_ALIGNMENTS, FASTEST, LaunchPlan, attention, plan_launch

__all__ = ["FINAL_STEP", "STEPS", "Step", "steps_for", "CAUSAL_ALIGNMENTS", "FASTEST",
           "LaunchPlan", "attention", "plan_launch"]
