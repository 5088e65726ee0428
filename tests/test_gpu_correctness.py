"""Every step against a float64 reference and against SDPA, on the GPU.

Outputs are poisoned with NaN before each launch, so an element the kernel never
wrote fails. A step passes when its largest error against float64 is at most twice
SDPA's own (PyTorch's default backend on the same inputs) plus a small epsilon, and its
log-sum-exp is within LSE_TOLERANCE of the float64 one (-inf exactly where a row sees no
key).
"""

import itertools

import pytest
import torch

import cutile_fmha
from cutile_fmha.assets.measure import (Shape, extra_peak_memory, make_inputs, sdpa,
                                        within_tolerance)
from cutile_fmha.platforms import HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS
from cutile_fmha.steps import attention, plan_launch
from cutile_fmha.steps.definitions import GUIDE_FINAL_STEP, steps_for
from cutile_fmha.steps.launcher import causal_query_offset
from cutile_fmha.steps.reference import reference_errors

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# float32 log-sum-exp from float32 sums of MUFU exponentials: errors of a few 1e-6 at
# these sizes; a wrong base or scale is off by far more than this.
LSE_TOLERANCE = 1e-4


def sdpa_bar(q, k, v, causal) -> float:
    """SDPA's own error against float64. Rows that see no key have no answer in SDPA's
    math path (NaN): they count as its defined answer, 0."""
    out = sdpa(q, k, v, causal=causal)
    offset = causal_query_offset(causal, q.shape[2], k.shape[2])
    if offset is not None and offset < 0:
        out[:, :, :-offset] = 0
    return reference_errors(out, q, k, v, causal=causal)[0]


def check_step(step, shape: Shape, seed=0, **launch):
    q, k, v = make_inputs(shape, seed=seed)
    out = torch.full_like(q, float("nan"))
    plan = plan_launch(q, k, v, causal=shape.causal, step=step, out=out, with_lse=True, **launch)
    plan.lse.fill_(float("nan"))
    plan.launch()
    plain = attention(q, k, v, causal=shape.causal, step=step,
                      out=torch.full_like(q, float("nan")), **launch)
    torch.cuda.synchronize()
    ours, lse_error = reference_errors(out, q, k, v, causal=shape.causal, lse=plan.lse)
    plain_error, _ = reference_errors(plain, q, k, v, causal=shape.causal)
    theirs = sdpa_bar(q, k, v, shape.causal)
    assert torch.isfinite(out).all() and torch.isfinite(plain).all(), \
        "NaN left in the output: elements never written"
    assert within_tolerance(ours, theirs, q.dtype) and within_tolerance(plain_error, theirs, q.dtype), \
        f"step {step}: max error {ours:.2e} (without LSE {plain_error:.2e}) vs SDPA's {theirs:.2e}"
    assert lse_error <= LSE_TOLERANCE, f"step {step}: log-sum-exp off by {lse_error:.2e}"


SMALL_STEPS = steps_for(HEAD_DIMS[0])  # steps 1-9, the whole head dim on chip
LARGE_STEPS = steps_for(LARGE_HEAD_DIMS[0])  # steps 10-11, the head dim tiled


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("seq_len", [1, 17, 1000, 4097])
@pytest.mark.parametrize("step", SMALL_STEPS)
def test_step_matches_reference(step, seq_len, causal, dtype, head_dim):
    check_step(step, Shape(2, 3, seq_len, seq_len, head_dim, causal, dtype),
               seed=seq_len * 7 + head_dim)


# Grouped-query heads (16 query heads over 16, 8, 4, 2 and 1 K/V heads: groups 1, 2, 4, 8
# and MQA), each causal alignment, fewer and more queries than keys, odd lengths; head dim
# and dtype rotate so that each step meets every pair of them.
KV_HEADS = [16, 8, 4, 2, 1]
HEAD_DIM_AND_DTYPE = list(itertools.product(HEAD_DIMS, ["float16", "bfloat16"]))
GQA_CASES = [
    pytest.param(step, kv_heads, causal, q_len, k_len,
                 *HEAD_DIM_AND_DTYPE[(i + step) % len(HEAD_DIM_AND_DTYPE)],
                 id=f"step{step}-kv{kv_heads}-{causal}-q{q_len}-k{k_len}")
    for step in SMALL_STEPS
    for i, (kv_heads, causal, (q_len, k_len)) in enumerate(itertools.product(
        KV_HEADS, [False, "top_left", "bottom_right"], [(257, 1001), (1001, 257)]))
]


@pytest.mark.parametrize("step,kv_heads,causal,q_len,k_len,head_dim,dtype", GQA_CASES)
def test_grouped_query_heads_and_causal_alignment(step, kv_heads, causal, q_len, k_len,
                                                  head_dim, dtype):
    check_step(step, Shape(2, 16, q_len, k_len, head_dim, causal, dtype, kv_heads),
               seed=q_len + kv_heads)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("q_len,k_len", [(17, 1000), (1000, 17), (1, 4097), (4097, 1), (300, 301)])
@pytest.mark.parametrize("step", SMALL_STEPS)
def test_query_and_key_lengths_differ(step, q_len, k_len, causal):
    check_step(step, Shape(3, 2, q_len, k_len, 128, causal, "bfloat16"), seed=q_len + k_len)


@pytest.mark.parametrize("platform", sorted(PLATFORMS) + ["default"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_another_architectures_entry_runs_here(platform, head_dim):
    check_step(GUIDE_FINAL_STEP, Shape(1, 4, 777, 777, head_dim, True, "float16"),
               platform=platform)


def test_non_contiguous_heads_layout():
    """(batch, seq, heads, D) memory viewed as (batch, heads, seq, D), as models store it."""
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
               for _ in range(3))
    out = attention(q, k, v, causal=True)
    assert reference_errors(out, q, k, v, causal=True)[0] < 2e-3
    # The output keeps that layout, so a model's transpose back to it copies nothing.
    assert out.stride() == q.stride() and out.transpose(1, 2).is_contiguous()


def test_gradients_of_the_models_layout_need_no_contiguous_copy():
    """The drop-in's output in the query's (batch, seq, heads, D) layout, and the gradient
    that comes back through the model's transpose (strided the same way) taken as it is:
    the same gradients as from a contiguous copy of it."""
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
               .requires_grad_() for _ in range(3))
    out = cutile_fmha.attention(q, k, v, is_causal=True)
    assert out.stride() == q.stride()
    grad = torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.float16).transpose(1, 2)
    strided = torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
    contiguous = torch.autograd.grad(out, (q, k, v), grad.contiguous())
    for mine, expected in zip(strided, contiguous):
        assert torch.equal(mine, expected)


# Past D=256 (steps 10 and 11, the head dim tiled): every head dim, causal and not, at this
# GPU's tuned launch (output slices where the autotuner chose them), dtypes in turn; odd
# lengths; grouped-query heads with both causal alignments; the rule other GPUs start from.
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", LARGE_HEAD_DIMS)
@pytest.mark.parametrize("step", LARGE_STEPS)
def test_large_head_dim_matches_reference(step, head_dim, causal):
    dtype = ["float16", "bfloat16"][LARGE_HEAD_DIMS.index(head_dim) % 2]
    check_step(step, Shape(1, 3, 1000, 1000, head_dim, causal, dtype), seed=head_dim + step)


@pytest.mark.parametrize("seq_len", [1, 17, 4097])
@pytest.mark.parametrize("head_dim", [512, 1024])
def test_large_head_dim_odd_lengths(head_dim, seq_len):
    check_step("fastest", Shape(1, 2, seq_len, seq_len, head_dim, True, "bfloat16"),
               seed=seq_len)


LARGE_GQA_CASES = [
    pytest.param(step, kv_heads, causal, q_len, k_len, head_dim,
                 id=f"step{step}-d{head_dim}-kv{kv_heads}-{causal}-q{q_len}-k{k_len}")
    for i, (step, kv_heads, causal, (q_len, k_len)) in enumerate(itertools.product(
        LARGE_STEPS, [4, 1], ["top_left", "bottom_right"], [(257, 1001), (1001, 257)]))
    for head_dim in [LARGE_HEAD_DIMS[i % len(LARGE_HEAD_DIMS)]]
]


@pytest.mark.parametrize("step,kv_heads,causal,q_len,k_len,head_dim", LARGE_GQA_CASES)
def test_large_head_dim_grouped_query_heads_and_causal_alignment(step, kv_heads, causal, q_len,
                                                                 k_len, head_dim):
    check_step(step, Shape(1, 8, q_len, k_len, head_dim, causal, "float16", kv_heads),
               seed=q_len + kv_heads)


@pytest.mark.parametrize("head_dim", [384, 640, 1024])
def test_large_head_dim_rule_of_other_architectures_runs_here(head_dim):
    """The default entry's rule (no tuned launch): step 10, output slices up to 704."""
    check_step("fastest", Shape(1, 4, 777, 777, head_dim, True, "float16"), platform="default")


@pytest.mark.parametrize("head_dim", [512, 1024])
def test_large_head_dim_extra_memory_is_the_output_alone(head_dim):
    """O(N) memory: one call allocates its output and nothing that grows with N^2."""
    q, k, v = make_inputs(Shape(1, 8, 4096, 4096, head_dim, True, "float16"))
    attention(q, k, v, causal=True)  # compiled and cached before measuring
    extra = extra_peak_memory(lambda: attention(q, k, v, causal=True))
    assert extra <= q.numel() * q.element_size() + (1 << 20), f"{extra} bytes"
