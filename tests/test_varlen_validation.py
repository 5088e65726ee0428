"""attention_varlen's argument checks, and how it says so. No GPU: every check that needs
no look at a device tensor's values comes before the device check; the ones that would
(cu_seqlens decreasing, not starting at 0, not ending at the total, a max_seqlen below
the truth) are documented instead, and the kernels stay inside the tensors whatever the
bounds say (tests/test_gpu_varlen.py)."""

import pytest
import torch

from cutile_fmha import attention_varlen

LENGTHS = (0, 5, 12, 20)  # three sequences: 5, 7 and 8 tokens


def packed(total=20, heads=4, kv_heads=4, head_dim=64, dtype=torch.float16):
    return (torch.randn(total, h, head_dim, dtype=dtype) for h in (heads, kv_heads, kv_heads))


def cu(values=LENGTHS, dtype=torch.int32):
    return torch.tensor(values, dtype=dtype)


def call(query=None, key=None, value=None, cu_q=None, cu_k=None, max_q=8, max_k=8, **options):
    q, k, v = packed()
    return attention_varlen(q if query is None else query, k if key is None else key,
                            v if value is None else value, cu() if cu_q is None else cu_q,
                            cu() if cu_k is None else cu_k, max_q, max_k, **options)


def test_importable_from_the_package_root():
    import cutile_fmha

    assert cutile_fmha.attention_varlen is attention_varlen
    assert "attention_varlen" in cutile_fmha.__all__


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_packed_tensors_have_three_dimensions(name):
    q, _, _ = packed()
    with pytest.raises(ValueError, match=rf"{name} must have 3 dimensions \(total tokens, "
                                         rf"heads, head_dim\).*got shape \(1, 20, 4, 64\)"):
        call(**{name: q[None]})


def test_not_a_tensor():
    with pytest.raises(TypeError, match="key must be a torch.Tensor, got list"):
        call(key=[1, 2])


def test_key_and_value_token_counts_differ():
    _, k, _ = packed(total=19)
    with pytest.raises(ValueError, match="key and value must have the same number of tokens"):
        call(key=k)


def test_dtype_and_head_dim_and_heads_are_checked_as_in_attention():
    q, k, v = packed(dtype=torch.float32)
    with pytest.raises(TypeError, match="query must be float16 or bfloat16, got torch.float32"):
        call(query=q)
    q, _, _ = packed(heads=6, kv_heads=4)
    with pytest.raises(ValueError, match="query's head count must be a multiple of key's"):
        call(query=q)
    q, k, v = packed(head_dim=100)
    with pytest.raises(ValueError, match="head dims must be one of .* or multiples of 8"):
        call(query=q, key=k, value=v)


@pytest.mark.parametrize("name", ["cu_q", "cu_k"])
def test_cu_seqlens_must_be_int32(name):
    argument = {"cu_q": "cu_seqlens_q", "cu_k": "cu_seqlens_k"}[name]
    with pytest.raises(TypeError, match=f"{argument} must be int32 .* got torch.int64"):
        call(**{name: cu(dtype=torch.int64)})
    with pytest.raises(TypeError, match=f"{argument} must be a torch.Tensor, got list"):
        call(**{name: list(LENGTHS)})


@pytest.mark.parametrize("values", [[0], [[0, 5], [5, 12]]], ids=["one entry", "2-D"])
def test_cu_seqlens_shape(values):
    with pytest.raises(ValueError, match=r"cu_seqlens_q must be 1-D with batch \+ 1 entries"):
        call(cu_q=cu(values))


def test_cu_seqlens_of_different_batches():
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k must have one entry per "
                                         "sequence and one more, so the same length, got 4 and 3"):
        call(cu_k=cu((0, 5, 20)))


@pytest.mark.parametrize("name", ["max_q", "max_k"])
def test_max_seqlen(name):
    argument = {"max_q": "max_seqlen_q", "max_k": "max_seqlen_k"}[name]
    with pytest.raises(TypeError, match=f"{argument} must be an int, got Tensor"):
        call(**{name: torch.tensor(8)})
    with pytest.raises(ValueError, match=f"{argument} must be at least 0, got -1"):
        call(**{name: -1})


def test_options():
    with pytest.raises(TypeError, match="is_causal must be a bool, got int"):
        call(is_causal=1)
    with pytest.raises(TypeError, match="return_lse must be a bool"):
        call(return_lse="yes")
    with pytest.raises(ValueError, match="scale must be a positive finite number"):
        call(scale=-1.0)


def test_cu_seqlens_must_be_on_querys_device():
    with pytest.raises(ValueError, match="cu_seqlens_k must be on query's device cpu .* got meta"):
        call(cu_k=cu().to("meta"))


def test_on_the_cpu_it_names_the_device():
    with pytest.raises(ValueError, match="query must be on a CUDA device, got cpu"):
        call()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cu_seqlens_on_another_device_than_query():
    q, k, v = (t.cuda() for t in packed())
    with pytest.raises(ValueError, match="cu_seqlens_q must be on query's device cuda:0 .* got "
                                         "cpu"):
        attention_varlen(q, k, v, cu(), cu().cuda(), 8, 8)


def test_one_view_per_packed_tensor_is_the_transposed_batch_row():
    from cutile_fmha.varlen import _one_batch_row

    qkv = torch.randn(20, 3, 4, 64)  # one packed projection: query, key and value strided
    for t in (qkv[:, 0], qkv[:, 1], torch.randn(20, 4, 64)[5:]):
        row = _one_batch_row(t)
        assert row.data_ptr() == t.data_ptr() and torch.equal(row, t.transpose(0, 1)[None])
        assert row.stride()[1:] == t.transpose(0, 1)[None].stride()[1:]


def test_cu_seqlens_go_to_the_kernels_as_they_are_and_their_ends_are_not_passed():
    from cutile_fmha.steps.family import UNUSED_ARRAY
    from cutile_fmha.steps.varlen import SequenceBounds

    cu_q, cu_k = cu(), cu()
    values = SequenceBounds.packed(cu_q, cu_k).values()
    assert values["QueryStarts"] is cu_q and values["KeyStarts"] is cu_k  # no views
    assert values["QueryEnds"] is UNUSED_ARRAY and values["KeyEnds"] is UNUSED_ARRAY
    assert values["CUMULATIVE_BOUNDS"] is True
    separate = SequenceBounds(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]).values()
    assert separate["CUMULATIVE_BOUNDS"] is False and separate["KeyEnds"] is not UNUSED_ARRAY
    with pytest.raises(ValueError, match="both given or both None"):
        SequenceBounds(cu_q, None, cu_k[:-1], cu_k[1:])


@pytest.mark.parametrize("options,error,message", [
    (dict(window_size=(3, -2)), ValueError, "window_size's sides must be -1"),
    (dict(softcap=0.0), ValueError, "softcap must be a positive finite number"),
    (dict(sinks=torch.zeros(3)), ValueError, r"sinks must be a floating-point tensor of one "
                                             r"logit per query head, shape \(4,\)"),
])
def test_variants_are_checked_before_the_device(options, error, message):
    with pytest.raises(error, match=message):
        call(**options)


def test_variants_run_head_dims_up_to_256():
    q, k, v = packed(head_dim=320)
    with pytest.raises(ValueError, match="window_size, softcap and sinks run head dims"):
        attention_varlen(q, k, v, cu(), cu(), 8, 8, softcap=30.0)


@pytest.mark.parametrize("causal", [False, True])
def test_variants_gradients_per_sequence_match_float64_autograd(causal, kernels_on_the_cpu):
    """The variable-length operator with softcap, window and sinks is differentiable in
    query, key, value and sinks: against autograd through the float64 reference run per
    sequence (its window aligned to the sequence's last key), with sequences whose query
    and key lengths differ (the kernels replaced by float64 on the CPU)."""
    from conftest import reference_with_variants

    from cutile_fmha.steps.variants import Variants
    from cutile_fmha.steps.varlen import SequenceBounds
    from cutile_fmha.varlen import varlen_attention

    generator = torch.Generator().manual_seed(5)
    cu_q, cu_k = cu((0, 5, 12, 20)), cu((0, 9, 12, 22))
    q, k, v = (torch.randn(1, h, rows, 64, generator=generator, dtype=torch.float64)
               for h, rows in ((4, 20), (2, 22), (2, 22)))
    sinks, grad = torch.randn(4, generator=generator), torch.randn(1, 4, 20, 64,
                                                                    generator=generator)
    variants = Variants(window=(4, 2), softcap=3.0, sinks=True)
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out, _ = varlen_attention(*leaves[:3], SequenceBounds.packed(cu_q, cu_k), 8, 9,
                              causal=causal, scale=None, variants=variants, sinks=leaves[3])
    out.backward(grad)
    wide = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
    for qs, qe, ks, ke in zip(cu_q[:-1].tolist(), cu_q[1:].tolist(), cu_k[:-1].tolist(),
                              cu_k[1:].tolist()):
        one, _ = reference_with_variants(wide[0][:, :, qs:qe], wide[1][:, :, ks:ke],
                                         wide[2][:, :, ks:ke], offset=(ke - ks) - (qe - qs),
                                         causal=causal, scale=64 ** -0.5, variants=variants,
                                         sinks=wide[3])
        one.backward(grad[:, :, qs:qe])
    for mine, theirs in zip(leaves, wide):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6)
    assert kernels_on_the_cpu["varlen_forward"] == kernels_on_the_cpu["varlen_backward"] == 1
