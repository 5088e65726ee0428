"""The FP8 forward without a GPU: to_fp8's scaling and layout, attention_fp8's argument
checks, the architectures it refuses, the exponentials it computes on the FMA pipes, and
the kernel's compile-only export (sm_90 at every head dim, one variant on each other
architecture that has float8)."""

import numpy as np
import pytest
import torch

from cutile_fmha import attention_fp8, incoherent_rotation, to_fp8
from cutile_fmha.kernels.common import EXP2_QUADRATIC, ROUNDING_MAGIC, ROUNDING_MAGIC_BITS
from cutile_fmha.platforms import PLATFORMS
from cutile_fmha.platforms.environment import find_compiler
from cutile_fmha.steps.compile import compile_fp8, compile_fp8_quantize
from cutile_fmha.steps.fp8 import (FIRST_FP8_ARCH, QUANTIZE_TILE_ELEMENTS, check_fp8_arch,
                                   quantize_settings, quantizes_on_the_gpu)

FP8 = torch.float8_e4m3fn


def test_importable_from_the_package_root():
    import cutile_fmha

    assert cutile_fmha.attention_fp8 is attention_fp8 and cutile_fmha.to_fp8 is to_fp8
    assert cutile_fmha.incoherent_rotation is incoherent_rotation
    assert {"attention_fp8", "to_fp8", "incoherent_rotation"} <= set(cutile_fmha.__all__)


def test_exp2_on_the_fma_pipes_is_well_within_the_rounding_of_p_to_float8():
    """kernels/common.py's exp2_on_fma in float32 NumPy, step for step: within a relative
    1.73e-3 of 2^x over the exponents a softmax meets (e4m3 rounds P by up to 2^-4)."""
    x = np.linspace(-125.0, 0.0, 1_000_001, dtype=np.float32)
    rounded = x + np.float32(ROUNDING_MAGIC)
    whole = rounded.view(np.int32) - np.int32(ROUNDING_MAGIC_BITS)
    f = x - (rounded - np.float32(ROUNDING_MAGIC))
    assert np.abs(f).max() <= 0.5
    c0, c1, c2 = (np.float32(c) for c in EXP2_QUADRATIC)
    fraction = c0 + f * (c1 + f * c2)
    result = (fraction.view(np.int32) + (whole << 23)).view(np.float32)
    relative = np.abs(result / np.exp2(x.astype(np.float64)) - 1)
    assert relative.max() < 1.75e-3


def test_to_fp8_scales_each_head_to_the_float8_range():
    x = torch.randn(2, 3, 50, 64) * torch.tensor([1.0, 10.0, 1e-3])[None, :, None, None]
    x8, descale = to_fp8(x)
    assert x8.dtype == FP8 and x8.shape == x.shape and descale.shape == (2, 3)
    assert torch.allclose(x8.float().abs().amax(dim=(2, 3)), torch.full((2, 3), 448.0))
    # e4m3 keeps 3 mantissa bits: each value within 1/16 of itself (or of the subnormals).
    restored = x8.float() * descale[:, :, None, None]
    assert ((restored - x).abs() <= x.abs() / 16 + descale[:, :, None, None] * 2 ** -9).all()


def test_to_fp8_transposes_the_value_and_pads_its_keys_with_zeros():
    v = torch.randn(1, 2, 37, 64)
    v8_t, descale = to_fp8(v, transpose=True)
    assert v8_t.shape == (1, 2, 64, 48) and v8_t.is_contiguous()
    assert torch.equal(v8_t[..., :37].float(), to_fp8(v)[0].transpose(2, 3).float())
    assert not v8_t[..., 37:].float().any()
    assert torch.equal(descale, to_fp8(v)[1])


def _outliers(*shape, generator):
    """FlashAttention-3's test inputs: N(0, 1), and for 0.1% of the entries N(0, 10) added."""
    x = torch.randn(*shape, generator=generator, dtype=torch.float64)
    spikes = torch.rand(*shape, generator=generator, dtype=torch.float64) < 1e-3
    return x + spikes * 10 * torch.randn(*shape, generator=generator, dtype=torch.float64)


def _scores(q, k):
    return q.double() @ k.double().repeat_interleave(q.shape[1] // k.shape[1], 1).transpose(2, 3)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_incoherent_rotation_keeps_the_scores_and_the_dtype(head_dim):
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(2, 4, 33, head_dim, generator=g)
    k = torch.randn(2, 2, 40, head_dim, generator=g)
    q_rot, k_rot = incoherent_rotation(q, k, generator=g)
    assert q_rot.dtype == q.dtype and q_rot.shape == q.shape and k_rot.shape == k.shape
    assert torch.allclose(_scores(q_rot, k_rot), _scores(q, k), atol=1e-4 * head_dim ** 0.5)
    assert not torch.allclose(q_rot, q, atol=0.1)  # it did rotate
    q16, k16 = (t.to(torch.bfloat16) for t in (q, k))
    q16_rot, k16_rot = incoherent_rotation(q16, k16, generator=g)
    assert q16_rot.dtype == torch.bfloat16
    # bfloat16's rounding of the rotated inputs, no more: within 2^-7 of each score's scale
    scale = q.norm(dim=-1, keepdim=True) * k.repeat_interleave(2, 1).norm(dim=-1)[:, :, None, :]
    assert ((_scores(q16_rot, k16_rot) - _scores(q16, k16)).abs() <= scale.double() * 2 ** -7).all()


def test_incoherent_rotation_is_one_rotation_for_query_and_key_drawn_from_the_generator():
    q, k = torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 64)
    first = incoherent_rotation(q, k, generator=torch.Generator().manual_seed(1))
    again = incoherent_rotation(q, k, generator=torch.Generator().manual_seed(1))
    other = incoherent_rotation(q, k, generator=torch.Generator().manual_seed(2))
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    # q itself as the key: the rotated key is the rotated query
    q_rot, k_rot = incoherent_rotation(q, q.clone(), generator=torch.Generator().manual_seed(3))
    assert torch.equal(q_rot, k_rot)


def _attention(q, k, v):
    return torch.softmax(_scores(q, k) / q.shape[-1] ** 0.5, -1) @ v.double()


def _dequantized(x):
    x8, descale = to_fp8(x)
    return x8.double() * descale[:, :, None, None].double()


def test_incoherent_rotation_shrinks_the_float8_inputs_error_where_there_are_outliers():
    """What it is for, on the CPU: float64 attention of the float8 (per-head scaled)
    inputs against the exact one, RMS error of the output, plain and with query and key
    rotated first. e4m3's rounding is relative, so a rotation changes little for
    standard-normal inputs; where outliers put a few entries far above the rest (here
    FlashAttention-3's test inputs, and outlier channels shared by query and key as in
    language models' activations) their products carry most of each score and its error,
    which the rotation spreads over the head dim."""
    g = torch.Generator().manual_seed(0)
    shape = (1, 4, 512, 128)
    normal = lambda: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    channels = torch.ones(128, dtype=torch.float64)
    channels[[3, 77]] = 20.0
    q, k, v = normal(), normal(), normal()
    cases = {"normal": (q, k, v), "channels": (q * channels, k * channels, v),
             "entries": tuple(_outliers(*shape, generator=g) for _ in range(3))}
    error = {}
    for name, (q, k, v) in cases.items():
        exact = _attention(q, k, v)
        for rotated in (False, True):
            qq, kk = incoherent_rotation(q, k, generator=g) if rotated else (q, k)
            out = _attention(_dequantized(qq), _dequantized(kk), _dequantized(v))
            error[name, rotated] = (out - exact).pow(2).mean().sqrt().item()
    assert 0.9 < error["normal", True] / error["normal", False] < 1.1
    assert error["entries", True] < 0.85 * error["entries", False]
    assert error["channels", True] < 0.3 * error["channels", False]


@pytest.mark.parametrize("query, key, error, message", [
    (torch.randn(1, 2, 8, 96), torch.randn(1, 2, 8, 96), ValueError, "power of two"),
    (torch.randn(1, 2, 8, 64), torch.randn(1, 2, 8, 128), ValueError, "head dim 64"),
    (torch.randn(2, 8, 64), torch.randn(1, 2, 8, 64), ValueError, "query must be"),
    (torch.randn(1, 2, 8, 64), "key", ValueError, "key must be"),
    (torch.randn(1, 2, 8, 64), torch.ones(1, 2, 8, 64, dtype=torch.int32), ValueError,
     "key must be a floating-point"),
])
def test_incoherent_rotation_arguments_are_checked(query, key, error, message):
    with pytest.raises(error, match=message):
        incoherent_rotation(query, key)
    with pytest.raises(TypeError, match="generator"):
        incoherent_rotation(torch.randn(1, 1, 2, 64), torch.randn(1, 1, 2, 64), generator=0)


def test_an_all_zero_head_gets_a_descale_of_one():
    x8, descale = to_fp8(torch.zeros(1, 1, 4, 64))
    assert descale.item() == 1.0 and not x8.float().any()


def fp8_inputs(batch=2, heads=8, kv_heads=2, q_len=33, k_len=40, head_dim=128):
    q8 = torch.randn(batch, heads, q_len, head_dim).to(FP8)
    k8 = torch.randn(batch, kv_heads, k_len, head_dim).to(FP8)
    v8_t = to_fp8(torch.randn(batch, kv_heads, k_len, head_dim), transpose=True)[0]
    return q8, k8, v8_t


def test_cpu_tensors_are_refused_last_with_the_device_named():
    with pytest.raises(ValueError, match="query must be on a CUDA device"):
        attention_fp8(*fp8_inputs())


@pytest.mark.parametrize("change,error,message", [
    (lambda q, k, v: (q.bfloat16(), k, v), TypeError,
     "query must be torch.float8_e4m3fn .see to_fp8., got torch.bfloat16"),
    (lambda q, k, v: (q, k.to(torch.float8_e5m2), v), TypeError, "key must be torch.float8_e4m3fn"),
    (lambda q, k, v: (q[0], k, v), ValueError, "query must have 4 dimensions"),
    (lambda q, k, v: (q, k, v.transpose(2, 3).contiguous()), ValueError,
     r"value_t must be the value transposed, \(batch, kv_heads, D, k_len rounded up to 16\) = "
     r"\(2, 2, 128, 48\)"),
    (lambda q, k, v: (q[..., :96], k[..., :96], v[:, :, :96]), ValueError,
     r"head dim \(last dimension of query\) must be one of \(64, 128, 256\), got 96"),
    (lambda q, k, v: (q[:, :7], k, v), ValueError, "multiple of key's"),
    (lambda q, k, v: (q[:1], k, v), ValueError, "key must be .* with query's batch 1"),
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "lengths must be at least 1"),
    (lambda q, k, v: (q.transpose(2, 3).contiguous().transpose(2, 3), k, v), ValueError,
     "query's last dimension must be contiguous"),
])
def test_tensors_are_checked(change, error, message):
    with pytest.raises(error, match=message):
        attention_fp8(*change(*fp8_inputs()))


@pytest.mark.parametrize("options,error,message", [
    (dict(q_descale=torch.ones(2, 2)), ValueError,
     r"q_descale must be float32 \(batch, heads\) = \(2, 8\), got torch.float32 \(2, 2\)"),
    (dict(k_descale=torch.ones(2, 8)), ValueError,
     r"k_descale must be float32 \(batch, kv_heads\) = \(2, 2\), got torch.float32 \(2, 8\)"),
    (dict(v_descale=torch.ones(2, 2, dtype=torch.float64)), ValueError, "v_descale must be float32"),
    (dict(k_descale=1.0), TypeError, "k_descale must be a torch.Tensor or None, got float"),
    (dict(is_causal=1), TypeError, "is_causal must be a bool"),
    (dict(return_lse=None), TypeError, "return_lse must be a bool"),
    (dict(scale=-1.0), ValueError, "scale must be a positive finite number"),
])
def test_options_are_checked(options, error, message):
    with pytest.raises(error, match=message):
        attention_fp8(*fp8_inputs(), **options)


def test_architectures_without_float8_are_refused_by_name():
    check_fp8_arch("sm_90")
    check_fp8_arch("sm_121")
    with pytest.raises(ValueError, match=f"needs a GPU of sm_{FIRST_FP8_ARCH} or newer.*sm_89"):
        check_fp8_arch("sm_89")


FP8_ARCHS = sorted(arch for arch in PLATFORMS if int(arch[3:]) >= FIRST_FP8_ARCH)
# (causal, write_lse, query heads per K/V head), rotated through the cases.
VARIANTS = [(True, False, 1), (False, True, 4), (True, True, 8)]


def _compile_cases():
    for index, head_dim in enumerate((64, 128, 256)):
        yield "sm_90", head_dim, VARIANTS[index % len(VARIANTS)]
    others = [arch for arch in FP8_ARCHS if arch != "sm_90"]
    for index, arch in enumerate(others):
        yield arch, 128, VARIANTS[index % len(VARIANTS)]


@pytest.mark.skipif(find_compiler().path is None, reason="tileiras is not installed")
@pytest.mark.parametrize("arch,head_dim,variant", list(_compile_cases()))
def test_fp8_kernel_compiles(arch, head_dim, variant):
    causal, write_lse, group = variant
    cubin = compile_fp8(arch, head_dim=head_dim, causal=causal, write_lse=write_lse,
                        query_group=group)
    assert cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("head_dim", [8, 64, 80, 96, 128, 256, 512, 1024])
@pytest.mark.parametrize("transpose", [False, True])
def test_quantization_tiles_cover_the_head_dim_in_a_power_of_two(head_dim, transpose):
    settings = quantize_settings(head_dim, transpose)
    tile_d, tile_s = settings["TILE_D"], settings["TILE_S"]
    assert tile_d >= head_dim and tile_d & (tile_d - 1) == 0 and tile_d < 2 * head_dim
    # a power of two of rows, at least a transposed tile's 16 bytes of float8
    assert tile_s >= 16 and tile_s & (tile_s - 1) == 0
    assert tile_s * tile_d <= max(QUANTIZE_TILE_ELEMENTS, 16 * tile_d)
    assert settings["TRANSPOSE"] is transpose


def test_cpu_tensors_are_quantized_by_pytorch_and_empty_heads_by_nothing():
    x = torch.randn(1, 2, 3, 64)
    assert not quantizes_on_the_gpu(x, torch.empty(x.shape, dtype=FP8))
    for shape, transpose, out_shape in (((1, 2, 0, 64), False, (1, 2, 0, 64)),
                                        ((1, 2, 0, 64), True, (1, 2, 64, 0)),
                                        ((0, 2, 5, 64), True, (0, 2, 64, 16))):
        x8, descale = to_fp8(torch.randn(shape), transpose=transpose)
        assert tuple(x8.shape) == out_shape and x8.dtype == FP8
        assert torch.equal(descale, torch.ones(shape[:2]))


@pytest.mark.skipif(find_compiler().path is None, reason="tileiras is not installed")
@pytest.mark.parametrize("arch,dtype,head_dim,transpose", [
    ("sm_90", "bfloat16", 128, True), ("sm_90", "float16", 64, False),
    ("sm_90", "bfloat16", 96, False), ("sm_90", "float16", 256, True)]
    + [(arch, "bfloat16", 128, index % 2 == 0)
       for index, arch in enumerate(a for a in FP8_ARCHS if a != "sm_90")])
def test_fp8_quantization_kernel_compiles(arch, dtype, head_dim, transpose):
    cubin = compile_fp8_quantize(arch, dtype=dtype, head_dim=head_dim, transpose=transpose)
    assert cubin[:4] == b"\x7fELF"
