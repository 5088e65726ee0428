"""The FP8 forward on the GPU: attention_fp8 against a float64 reference on the same
float8 inputs (dequantized), so that what is measured is the kernel's own error: P rounded
to e4m3 for the second product, and the bfloat16 output.

Inputs are fresh standard-normal tensors through to_fp8 (per-head scaling), lengths odd
and 1, key lengths that are no multiple of 16 (the transposed value's padding), GQA,
causal and not, the LSE, and descale factors of None."""

import math

import pytest
import torch

from cutile_fmha import attention_fp8, incoherent_rotation, to_fp8
from cutile_fmha.steps.fp8 import quantizes_on_the_gpu

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# P in e4m3 has 3 mantissa bits: each probability is off by up to 1/16 of itself, and the
# errors of a row's keys partly cancel. Measured on an H100 at these cases (2026-11-23):
# the largest error 1.6% of the largest |output|, the RMS error 0.10%, the LSE off by up
# to 0.016 (scores of tens; the float8 products accumulate in reduced precision). Since
# 2026-11-27 both products accumulate in the tensor cores (kernels/fp8.py); these bounds
# held unchanged on an H200.
MAX_ERROR = 0.04
RMS_ERROR = 0.003


def dequantized(x8, descale, heads):
    """x8 * descale in float64, with the K/V heads repeated for grouped-query attention
    (descale: one per head of x8)."""
    x = x8.double() * descale.double()[:, :, None, None]
    return x.repeat_interleave(heads // x.shape[1], 1)


def reference(q8, k8, v8_t, descales, k_len, causal, scale):
    heads = q8.shape[1]
    q, k = dequantized(q8, descales[0], heads), dequantized(k8, descales[1], heads)
    v = dequantized(v8_t, descales[2], heads)[..., :k_len].transpose(2, 3)
    scores = q @ k.transpose(2, 3) * scale
    if causal:
        rows = torch.arange(q.shape[2], device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(k_len, device=q.device)[None, :] > rows,
                                    -math.inf)
    lse = torch.logsumexp(scores, -1)
    return torch.exp(scores - lse[..., None]) @ v, lse


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("batch,heads,kv_heads,q_len,k_len", [
    (2, 4, 4, 333, 333), (1, 8, 2, 1, 77), (2, 4, 1, 200, 1), (1, 2, 2, 1024, 1024)])
def test_fp8_forward_matches_float64_on_the_same_inputs(head_dim, causal, batch, heads, kv_heads,
                                                         q_len, k_len):
    generator = torch.Generator(device="cuda").manual_seed(q_len * 7 + k_len)
    shapes = ((batch, heads, q_len, head_dim), (batch, kv_heads, k_len, head_dim),
              (batch, kv_heads, k_len, head_dim))
    # Heads of different magnitudes (up to 3x, scores of up to 20 standard deviations):
    # each head's own descale factor must be the one applied.
    (q8, qd), (k8, kd), (v8_t, vd) = (
        to_fp8(torch.randn(shape, generator=generator, device="cuda")
               * torch.linspace(1, 3, shape[1], device="cuda")[:, None, None], transpose=i == 2)
        for i, shape in enumerate(shapes))
    scale = head_dim ** -0.5
    out, lse = attention_fp8(q8, k8, v8_t, q_descale=qd, k_descale=kd, v_descale=vd,
                             is_causal=causal, return_lse=True)
    expected, expected_lse = reference(q8, k8, v8_t, (qd, kd, vd), k_len, causal, scale)
    assert out.dtype == torch.bfloat16 and out.shape == q8.shape
    assert lse.shape == q8.shape[:-1] and lse.dtype == torch.float32
    error = (out.double() - expected).abs()
    largest = expected.abs().max()
    assert error.max() <= MAX_ERROR * largest, f"max error {error.max() / largest:.4f}"
    assert error.pow(2).mean().sqrt() <= RMS_ERROR * largest, \
        f"RMS error {error.pow(2).mean().sqrt() / largest:.4f}"
    # Scores reach tens: the LSE's error is relative (the float8 products' accumulation).
    assert torch.allclose(lse.double(), expected_lse, atol=2e-3, rtol=2e-3), \
        f"LSE off by up to {(lse.double() - expected_lse).abs().max():.4f}"


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_incoherent_rotation_cuts_the_error_of_outlier_channels(head_dim):
    """bfloat16 query and key whose channels 3 and 7 are 20x the others (as language
    models' activations have), through to_fp8 and attention_fp8, against float64 attention
    of the bfloat16 inputs: rotated first, the RMS error is at most half; without outliers
    the rotation changes it by at most 10% (measured 2026-11-27: docs/performance.md)."""
    generator = torch.Generator(device="cuda").manual_seed(head_dim)
    shape = (2, 4, 500, head_dim)
    q, k, v = (torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    channels = torch.ones(head_dim, device="cuda", dtype=torch.bfloat16)
    channels[[3, 7]] = 20
    error = {}
    for name, (qq, kk) in (("normal", (q, k)), ("channels", (q * channels, k * channels))):
        scores = qq.double() @ kk.double().transpose(2, 3) * head_dim ** -0.5
        expected = torch.softmax(scores, -1) @ v.double()
        for rotated in (False, True):
            q_in, k_in = incoherent_rotation(qq, kk, generator=torch.Generator().manual_seed(0)) \
                if rotated else (qq, kk)
            (q8, qd), (k8, kd), (v8_t, vd) = to_fp8(q_in), to_fp8(k_in), to_fp8(v, transpose=True)
            out = attention_fp8(q8, k8, v8_t, q_descale=qd, k_descale=kd, v_descale=vd)
            error[name, rotated] = (out.double() - expected).pow(2).mean().sqrt().item()
    assert error["channels", True] <= 0.5 * error["channels", False], error
    assert error["normal", True] <= 1.1 * error["normal", False], error


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [64, 96, 128, 256])
@pytest.mark.parametrize("seq_len", [1, 37, 1000])
def test_to_fp8_on_the_gpu_gives_the_pytorch_formulas_bits(dtype, head_dim, seq_len):
    """to_fp8's kernel (one read, one write) against x.float() / descale rounded to e4m3
    by PyTorch: the same bits, in both layouts, for heads of very different magnitudes, an
    all-zero head and a (batch, seq, heads, D) tensor seen as (batch, heads, seq, D)."""
    generator = torch.Generator(device="cuda").manual_seed(seq_len + head_dim)
    magnitudes = torch.tensor([1.0, 1e-3, 300.0, 0.0], device="cuda")[None, None, :, None]
    x = (torch.randn(2, seq_len, 4, head_dim, generator=generator, device="cuda")
         * magnitudes).to(dtype).transpose(1, 2)
    amax = x.float().abs().amax(dim=(2, 3))
    expected_descale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    scaled = (x.float() / expected_descale[:, :, None, None]).to(torch.float8_e4m3fn)
    for transpose in (False, True):
        x8, descale = to_fp8(x, transpose=transpose)
        assert quantizes_on_the_gpu(x, x8)  # the kernel, not the PyTorch formula itself
        expected = scaled
        if transpose:
            expected = torch.zeros(x8.shape, dtype=torch.float8_e4m3fn, device="cuda")
            expected[..., :seq_len] = scaled.transpose(2, 3)
        assert x8.shape == expected.shape and x8.is_contiguous()
        assert torch.equal(descale, expected_descale)
        assert torch.equal(x8.view(torch.uint8), expected.view(torch.uint8))


def test_to_fp8_under_torch_compile_gives_the_kernels_bits():
    """A compiled graph runs the PyTorch formula (no launch inside the trace): the same
    values as the kernel's, both layouts."""
    x = torch.randn(2, 4, 300, 128, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(to_fp8, fullgraph=True)
    for transpose in (False, True):
        eager, traced = to_fp8(x, transpose=transpose), compiled(x, transpose=transpose)
        assert torch.equal(eager[0].view(torch.uint8), traced[0].view(torch.uint8))
        assert torch.equal(eager[1], traced[1])


def test_descales_default_to_one_and_are_applied():
    generator = torch.Generator(device="cuda").manual_seed(3)
    q8, k8, v8 = (torch.randn(1, 2, 128, 128, generator=generator, device="cuda")
                  .to(torch.float8_e4m3fn) for _ in range(3))
    v8_t = v8.transpose(2, 3).contiguous()
    ones = torch.ones(1, 2, device="cuda")
    plain = attention_fp8(q8, k8, v8_t)
    assert torch.equal(plain, attention_fp8(q8, k8, v8_t, q_descale=ones, k_descale=ones,
                                            v_descale=ones))
    # Twice the value: twice the output, exactly (a power of two).
    doubled = attention_fp8(q8, k8, v8_t, v_descale=ones * 2)
    assert torch.equal(doubled, plain * 2)
    # Q's factor and the softmax scale are one number to the kernel.
    assert torch.allclose(attention_fp8(q8, k8, v8_t, q_descale=ones * 0.5).float(),
                          attention_fp8(q8, k8, v8_t, scale=0.5 * 128 ** -0.5).float(),
                          atol=1e-2)
