"""The backward pass and autograd through cutile_fmha.attention, on the GPU.

dq, dk and dv are checked against float64 autograd of the reference on fresh random
inputs: each gradient's largest error, relative to its largest magnitude, must be at most
twice SDPA's own on the same inputs plus a small epsilon.
"""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from cutile_fmha import attention, attention_with_lse
from cutile_fmha.assets.measure import DTYPES, TOLERANCE_EPSILON
from cutile_fmha.steps.reference import reference, reference_gradients

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def inputs(batch, heads, kv_heads, q_len, k_len, head_dim, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(h, n):
        return torch.randn(batch, h, n, head_dim, generator=generator, device="cuda",
                           dtype=DTYPES[dtype])

    return randn(heads, q_len), randn(kv_heads, k_len), randn(kv_heads, k_len), \
        randn(heads, q_len)


def mask_options(causal, q_len, k_len):
    if causal == "bottom_right":
        return {"attn_mask": causal_lower_right(q_len, k_len)}
    return {"is_causal": bool(causal)}


def gradients(fn, q, k, v, grad_out, **options):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **options)
    out.backward(grad_out)
    return out, (q.grad, k.grad, v.grad)


def relative_errors(got, want):
    return [((g.double() - w).abs().max() / w.abs().max()).item() for g, w in zip(got, want)]


CASES = [  # (heads, kv_heads, q_len, k_len, head_dim, dtype, causal)
    *[(4, 4, n, n, d, dtype, causal) for d in (64, 128, 256) for dtype in ("float16", "bfloat16")
      for causal in (False, True) for n in (17, 1000)],
    (8, 2, 300, 1000, 128, "float16", "bottom_right"),
    (8, 1, 300, 1000, 64, "bfloat16", "bottom_right"),
    (8, 2, 1000, 300, 128, "float16", True),
    (8, 4, 257, 257, 256, "bfloat16", False),
    (2, 2, 1, 1, 64, "float16", True),
]


@pytest.mark.parametrize("heads,kv_heads,q_len,k_len,head_dim,dtype,causal", CASES)
def test_gradients_match_float64(heads, kv_heads, q_len, k_len, head_dim, dtype, causal):
    check_gradients(heads, kv_heads, q_len, k_len, head_dim, dtype, causal)


# With dQ added by the dK/dV kernel ("dkdv_dq"), forced at every grid: each head dim, both
# alignments, GQA, D=96 (Q's and K's columns as 64 + 32: two dQ tiles), lengths 1 and no
# tile multiple.
ATOMIC_DQ_CASES = [case for case in CASES if case[5] == "bfloat16" or case[0] != 4] + [
    (8, 2, 1000, 300, 256, "float16", True), (8, 4, 333, 333, 96, "bfloat16", True)]


@pytest.mark.parametrize("heads,kv_heads,q_len,k_len,head_dim,dtype,causal", ATOMIC_DQ_CASES)
def test_gradients_with_dq_added_atomically_match_float64(dq_added_atomically, heads, kv_heads,
                                                          q_len, k_len, head_dim, dtype,
                                                          causal):
    check_gradients(heads, kv_heads, q_len, k_len, head_dim, dtype, causal)


@pytest.mark.parametrize("heads,kv_heads,q_len,k_len,head_dim,dtype,causal", ATOMIC_DQ_CASES)
def test_gradients_with_dq_added_one_turn_late_match_float64(dq_added_late, heads, kv_heads,
                                                             q_len, k_len, head_dim, dtype,
                                                             causal):
    check_gradients(heads, kv_heads, q_len, k_len, head_dim, dtype, causal)


def test_deterministic_algorithms_run_the_two_kernels(dq_added_atomically, launched_kernels):
    """Atomic adds sum dQ in the order the CTAs reach them; under
    torch.use_deterministic_algorithms the backward runs dQ (which writes Delta) and dK/dV
    as two kernels, whose gradients are the same from run to run."""
    q, k, v, grad_out = inputs(2, 8, 2, 1000, 1000, 64, "bfloat16", seed=13)
    gradients(attention, q, k, v, grad_out, is_causal=True)
    assert launched_kernels[-2:] == ["row_dot", "dkdv"]  # and dQ with it
    torch.use_deterministic_algorithms(True)
    try:
        runs = [gradients(attention, q, k, v, grad_out, is_causal=True)[1] for _ in range(3)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert launched_kernels[-3:] == ["fmha", "dq", "dkdv"]  # dQ writes Delta: no row_dot
    assert all(torch.equal(a, b) for run in runs[1:] for a, b in zip(run, runs[0]))


# Without the causal mask and with many query rows, "dkdv_dq" runs once per chunk of
# queries (here of 128 rows: the queries_in_chunks fixture), with a last chunk cut short;
# on Q's and K's columns split in two tiles (D=96: 64 + 32) in one launch.
CHUNK_CASES = [(4, 4, 1000, 700, d, "bfloat16", False) for d in (64, 112, 128, 256)] + [
    (8, 2, 300, 1000, 128, "float16", False), (4, 4, 700, 1000, 96, "bfloat16", False)]


@pytest.mark.parametrize("heads,kv_heads,q_len,k_len,head_dim,dtype,causal", CHUNK_CASES)
def test_gradients_with_queries_in_chunks_match_float64(queries_in_chunks, launched_kernels,
                                                        heads, kv_heads, q_len, k_len,
                                                        head_dim, dtype, causal):
    check_gradients(heads, kv_heads, q_len, k_len, head_dim, dtype, causal)
    chunks = 1 if head_dim == 96 else -(-q_len // 128)
    assert launched_kernels.count("dkdv") == chunks and "dq" not in launched_kernels


def check_gradients(heads, kv_heads, q_len, k_len, head_dim, dtype, causal):
    q, k, v, grad_out = inputs(2, heads, kv_heads, q_len, k_len, head_dim, dtype,
                               seed=q_len * 3 + head_dim)
    options = mask_options(causal, q_len, k_len)
    _, ours = gradients(attention, q, k, v, grad_out, **options)
    _, sdpa = gradients(F.scaled_dot_product_attention, q, k, v, grad_out, **options)
    want = reference_gradients(q, k, v, grad_out, causal=causal)
    assert all(torch.isfinite(g).all() for g in ours), "NaN or inf in a gradient"
    for name, error, bar in zip(("dq", "dk", "dv"), relative_errors(ours, want),
                                relative_errors(sdpa, want)):
        assert error <= 2 * bar + TOLERANCE_EPSILON[q.dtype], \
            f"{name}: relative error {error:.2e}, SDPA's {bar:.2e}"


def test_training_and_inference_paths_give_the_same_output():
    q, k, v, _ = inputs(2, 8, 2, 777, 777, 128, "bfloat16", seed=5)
    with torch.no_grad():
        inference = attention(q, k, v, is_causal=True, enable_gqa=True)
    training = attention(q.requires_grad_(), k, v, is_causal=True, enable_gqa=True)
    assert training.requires_grad and torch.equal(training.detach(), inference)
    out, lse = attention_with_lse(q, k, v, is_causal=True, enable_gqa=True)
    assert out.requires_grad and not lse.requires_grad


def test_scale_reaches_the_backward():
    q, k, v, grad_out = inputs(1, 2, 2, 200, 200, 64, "float16", seed=9)
    _, ours = gradients(attention, q, k, v, grad_out, scale=0.3)
    want = reference_gradients(q, k, v, grad_out, scale=0.3)
    assert max(relative_errors(ours, want)) < 1e-2


def test_torch_compile_of_a_module_that_calls_it():
    class Attention(torch.nn.Module):
        def forward(self, q, k, v):
            return attention(q, k, v, is_causal=True, enable_gqa=True)

    q, k, v, grad_out = inputs(2, 8, 2, 300, 300, 64, "float16", seed=11)
    eager_out, eager_grads = gradients(lambda q, k, v, **_: Attention()(q, k, v), q, k, v,
                                       grad_out)
    compiled = torch.compile(Attention(), fullgraph=True)
    out, grads = gradients(lambda q, k, v, **_: compiled(q, k, v), q, k, v, grad_out)
    assert torch.equal(out, eager_out)
    # dK and dV the same; dQ, which D=64 adds with atomics in any order, to its rounding
    assert all(torch.equal(a, b) for a, b in zip(grads[1:], eager_grads[1:]))
    torch.testing.assert_close(grads[0], eager_grads[0], rtol=2e-3, atol=2e-3)


def test_heads_past_32_bit_strides_run_in_groups_as_separate_calls(large_gpu_memory):
    """1024 K/V heads of 4096 keys with 4 query heads each, D=128: q, out and the gradients
    hold 2^31 elements, past cuTile's 32-bit strides in one launch, so attention() and its
    backward run two groups of 512 K/V heads (with their 2048 query heads) on views. Out,
    LSE, dq, dk and dv equal calls on each half's heads apart bit for bit (causal: the two
    deterministic backward kernels), and the output and gradients of the heads at the
    groups' edges match float64."""
    heads, kv_heads, n = 4096, 1024, 4096
    q, k, v, grad_out = inputs(1, heads, kv_heads, n, n, 128, "bfloat16", seed=31)
    assert q.numel() == 2 ** 31

    def forward_backward(q, k, v, grad_out):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out, lse = attention_with_lse(q, k, v, is_causal=True, enable_gqa=True)
        out.backward(grad_out)
        return out.detach(), lse, q.grad, k.grad, v.grad

    whole = forward_backward(q, k, v, grad_out)
    for half in range(2):
        rows, keys = slice(half * heads // 2, (half + 1) * heads // 2), \
            slice(half * kv_heads // 2, (half + 1) * kv_heads // 2)
        apart = forward_backward(*(t[:, side].contiguous() for t, side in
                                   ((q, rows), (k, keys), (v, keys), (grad_out, rows))))
        for got, want, side in zip(whole, apart, (rows, rows, rows, keys, keys)):
            assert torch.equal(got[:, side], want)
        del apart
    for kv_head in (kv_heads // 2 - 1, kv_heads // 2):  # the groups' last and first
        rows, keys = slice(kv_head * 4, kv_head * 4 + 4), slice(kv_head, kv_head + 1)
        parts = [t[:, side] for t, side in ((q, rows), (k, keys), (v, keys), (grad_out, rows))]
        want = (reference(*parts[:3], causal=True)[0], *reference_gradients(*parts, causal=True))
        sdpa_out, sdpa_grads = gradients(F.scaled_dot_product_attention, *parts, is_causal=True)
        ours = [t[:, side] for t, side in zip(whole[:1] + whole[2:], (rows, rows, keys, keys))]
        for error, bar in zip(relative_errors(ours, want),
                              relative_errors((sdpa_out, *sdpa_grads), want)):
            assert error <= 2 * bar + TOLERANCE_EPSILON[q.dtype], (error, bar)
