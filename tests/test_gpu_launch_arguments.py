"""Every launch passes an array exactly where its family says the kernel reads one, and
UNUSED_ARRAY elsewhere: the launches run the machine code the compile-only export builds
(steps/family.py's Tensor.read_when), and pay no array conversion for what they skip."""

import inspect

import cuda.tile as ct
import pytest
import torch

from cutile_fmha import (attention, attention_fp8, attention_varlen, attention_with_kvcache,
                         to_fp8)
from cutile_fmha.steps import family as families
from cutile_fmha.steps.family import UNUSED_ARRAY, KeptArray, KernelFamily, Tensor

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FAMILIES = [f for f in vars(families).values() if isinstance(f, KernelFamily)]


@pytest.fixture
def launches(monkeypatch):
    """The (family, arguments) of every ct.launch made while the test runs."""
    made = []
    launch = ct.launch

    def recorded(stream, grid, kernel, arguments, **options):
        names = tuple(inspect.signature(kernel._pyfunc).parameters)
        [family, *_] = [f for f in FAMILIES if f.names == names]
        made.append((family, arguments))
        return launch(stream, grid, kernel, arguments, **options)
    monkeypatch.setattr(ct, "launch", recorded)
    return made


def arrays_passed(family: KernelFamily, arguments: tuple) -> dict[str, bool]:
    """Whether each array parameter got an array, checked against what the family reads."""
    values = dict(zip(family.names, arguments))
    passed = {}
    for p in family.parameters:
        if isinstance(p, Tensor):
            passed[p.name] = isinstance(values[p.name], (torch.Tensor, KeptArray))
            expected = p.read(values)
            assert passed[p.name] == expected, \
                f"{family.name}: {p.name} passed as {type(values[p.name]).__name__}, " \
                f"read: {expected}"
            if not expected:
                assert values[p.name] is UNUSED_ARRAY
    return passed


def inputs(batch, heads, kv_heads, q_len, k_len, head_dim=64, dtype=torch.bfloat16):
    generator = torch.Generator(device="cuda").manual_seed(q_len * 131 + k_len)
    return [torch.randn(batch, h, n, head_dim, generator=generator, device="cuda", dtype=dtype)
            for h, n in ((heads, q_len), (kv_heads, k_len), (kv_heads, k_len))]


def test_dense_forward_passes_no_lse_it_does_not_write(launches):
    q, k, v = inputs(1, 4, 2, 100, 130)
    attention(q, k, v, is_causal=True, enable_gqa=True)
    attention(q, k, v, softcap=20.0, enable_gqa=True)
    attention(q, k, v, sinks=torch.randn(4, device="cuda"), enable_gqa=True)
    passed = [arrays_passed(*launch) for launch in launches]
    assert [p["Lse"] for p in passed] == [False] * 3
    assert [p.get("Sinks") for p in passed] == [None, False, True]


def test_fp8_forward_passes_no_lse_it_does_not_write(launches):
    q, k, v = inputs(1, 4, 4, 100, 130)
    (q8, _), (k8, _), (v8_t, _) = (to_fp8(t, transpose=t is v) for t in (q, k, v))
    attention_fp8(q8, k8, v8_t)
    attention_fp8(q8, k8, v8_t, return_lse=True)
    passed = [arrays_passed(*launch) for launch in launches]  # to_fp8's three, then two
    assert [f.name for f, _ in launches] == ["float8 quantization"] * 3 + ["forward, float8"] * 2
    assert [p["Lse"] for p in passed[3:]] == [False, True]


def test_variable_length_forward_passes_lse_and_sinks_only_when_asked(launches):
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in inputs(1, 4, 2, 100, 130))
    cu_q, cu_k = (torch.tensor([0, 40, n], dtype=torch.int32, device="cuda") for n in (100, 130))
    attention_varlen(q, k, v, cu_q, cu_k, 60, 90)
    attention_varlen(q, k, v, cu_q, cu_k, 60, 90, return_lse=True,
                     sinks=torch.randn(4, device="cuda"))
    passed = [arrays_passed(*launch) for launch in launches]
    assert [(p["Lse"], p["Sinks"]) for p in passed] == [(False, False), (True, True)]


def test_decode_passes_only_the_arrays_of_its_lookups_and_splits(launches):
    q, key_cache, value_cache = inputs(2, 8, 2, 1, 1024, head_dim=128)
    lengths = torch.tensor([700, 1024], dtype=torch.int32, device="cuda")
    attention_with_kvcache(q, key_cache, value_cache, num_splits=1)
    attention_with_kvcache(q, key_cache, value_cache, lengths, num_splits=4, return_lse=True)
    passed = [arrays_passed(*launch) for launch in launches]
    assert [f.name for f, _ in launches] == ["decode", "decode", "decode merge_splits"]
    assert [(p["KeyEnds"], p["Partial"], p["Lse"], p["BlockTable"]) for p in passed[:2]] == \
        [(False, False, False, False), (True, True, True, False)]
    assert passed[2]["Lse"]


@pytest.mark.parametrize("head_dim,batch,heads,kv_heads,length,options,adds_dq", [
    (64, 2, 16, 4, 1000, {}, True), (256, 1, 4, 4, 300, {}, True),
    (128, 2, 32, 4, 1000, {}, False), (128, 2, 16, 4, 1000, {}, True),
    (128, 2, 32, 4, 1000, {"is_causal": False}, True),
    (128, 1, 8, 8, 1000, {}, True),
    (128, 2, 16, 8, 1000, {}, True), (128, 2, 16, 4, 1000, {"softcap": 30.0}, True),
    (128, 1, 8, 8, 1000, {"window_size": (256, 0)}, True), (96, 2, 16, 4, 1000, {}, True)])
def test_backward_adds_dq_in_dkdv_where_the_platform_says(launches, head_dim, batch, heads,
                                                          kv_heads, length, options, adds_dq):
    """The dense backward runs "dkdv_dq" (dK/dV with ATOMIC_DQ, handed the float32 dQ
    buffer, and no dQ kernel) where the platform has that launch for the call (D=64 and
    256; at 128's launch only with a softcap, a window, split columns (D=96), without the
    causal mask or with at most four query heads to a K/V head), else dK/dV and dQ; causal
    unless said."""
    q, k, v = (t.requires_grad_() for t in inputs(batch, heads, kv_heads, length, length,
                                                   head_dim))
    attention(q, k, v, **{"is_causal": True} | options, enable_gqa=heads != kv_heads).backward(
        torch.randn_like(q))
    [dkdv] = [arguments for family, arguments in launches if family is families.DKDV]
    assert arrays_passed(families.DKDV, dkdv)["dQAcc"] == adds_dq
    assert any(family is families.DQ for family, _ in launches) != adds_dq


@pytest.mark.parametrize("causal", [True, False])
def test_packed_backward_adds_dq_in_dkdv_at_d128_with_grouped_heads(launches, causal):
    """A variable-length batch at D=128 runs "dkdv_dq" with four query heads to a K/V head,
    causal too (as a dense causal batch does with at most four: above)."""
    generator = torch.Generator(device="cuda").manual_seed(7)
    lengths = [300, 1000, 1]
    q, k, v = (torch.randn(sum(lengths), heads, 128, generator=generator, device="cuda",
                           dtype=torch.bfloat16, requires_grad=True) for heads in (16, 4, 4))
    cu_seqlens = torch.tensor([0, 300, 1300, 1301], dtype=torch.int32, device="cuda")
    attention_varlen(q, k, v, cu_seqlens, cu_seqlens, max(lengths), max(lengths),
                     is_causal=causal).backward(torch.randn_like(q))
    [dkdv] = [arguments for family, arguments in launches if family is families.DKDV_VARLEN]
    assert arrays_passed(families.DKDV_VARLEN, dkdv)["dQAcc"]
    assert not any(family is families.DQ_VARLEN for family, _ in launches)
