"""Every step against a float64 reference and against SDPA, on the GPU.

Outputs are poisoned with NaN before each launch, so an element the kernel never
wrote fails. A step passes when its largest error against float64 is at most twice
SDPA's own (PyTorch's default backend on the same inputs) plus a small epsilon.
"""

import pytest
import torch

from cutile_fmha.assets.measure import Shape, make_inputs, reference_error, sdpa, within_tolerance
from cutile_fmha.platforms import PLATFORMS
from cutile_fmha.steps import STEPS, attention

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

def check_step(step, shape: Shape, seed=0, **launch):
    q, k, v = make_inputs(shape, seed=seed)
    out = torch.full_like(q, float("nan"))
    attention(q, k, v, causal=shape.causal, step=step, out=out, **launch)
    torch.cuda.synchronize()
    ours = reference_error(out, q, k, v, causal=shape.causal)
    theirs = reference_error(sdpa(q, k, v, causal=shape.causal), q, k, v, causal=shape.causal)
    assert torch.isfinite(out).all(), "NaN left in the output: elements never written"
    assert within_tolerance(ours, theirs, q.dtype), \
        f"step {step}: max error {ours:.2e} vs SDPA's {theirs:.2e}"


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len", [1, 17, 1000, 4097])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_step_matches_reference(step, seq_len, causal, dtype, head_dim):
    check_step(step, Shape(2, 3, seq_len, seq_len, head_dim, causal, dtype),
               seed=seq_len * 7 + head_dim)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("q_len,k_len", [(17, 1000), (1000, 17), (1, 4097), (4097, 1), (300, 301)])
@pytest.mark.parametrize("step", sorted(STEPS))
def test_query_and_key_lengths_differ(step, q_len, k_len, causal):
    check_step(step, Shape(3, 2, q_len, k_len, 128, causal, "bfloat16"), seed=q_len + k_len)


@pytest.mark.parametrize("platform", sorted(PLATFORMS) + ["default"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_another_architectures_entry_runs_here(platform, head_dim):
    check_step(6, Shape(1, 4, 777, 777, head_dim, True, "float16"), platform=platform)


def test_non_contiguous_heads_layout():
    """(batch, seq, heads, D) memory viewed as (batch, heads, seq, D), as models store it."""
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
               for _ in range(3))
    out = attention(q, k, v, causal=True)
    assert reference_error(out, q, k, v, causal=True) < 2e-3
