"""cutile_fmha.attention, the drop-in for F.scaled_dot_product_attention: what it refuses
and how it says so (no GPU needed: every check comes before the device check), and on the
GPU that it computes what SDPA computes."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from cutile_fmha import attention, attention_with_lse
from cutile_fmha.steps.reference import reference_errors


def qkv(heads=4, kv_heads=4, q_len=40, k_len=40, head_dim=64, device="cpu"):
    return (torch.randn(2, h, n, head_dim, dtype=torch.float16, device=device)
            for h, n in ((heads, q_len), (kv_heads, k_len), (kv_heads, k_len)))


def test_importable_from_the_package_root():
    import cutile_fmha

    assert cutile_fmha.attention is attention and "attention_with_lse" in cutile_fmha.__all__
    with pytest.raises(AttributeError, match="no attribute 'attend'"):
        cutile_fmha.attend


@pytest.mark.parametrize("mask", [torch.ones(40, 40, dtype=torch.bool), torch.zeros(40, 40)],
                         ids=["bool", "float"])
def test_mask_tensors_are_refused(mask):
    with pytest.raises(TypeError, match="attn_mask must be None or a torch.nn.attention.bias"
                                        ".CausalBias .* got Tensor"):
        attention(*qkv(), attn_mask=mask)


def test_causal_bias_with_is_causal():
    with pytest.raises(ValueError, match="attn_mask is a CausalBias, so is_causal must be False"):
        attention(*qkv(), attn_mask=causal_lower_right(40, 40), is_causal=True)


def test_causal_bias_for_other_lengths():
    with pytest.raises(ValueError, match=r"attn_mask was made for \(q_len, k_len\) = \(40, 50\), "
                                         r"but query and key have \(40, 40\)"):
        attention(*qkv(), attn_mask=causal_upper_left(40, 50))


@pytest.mark.parametrize("dropout_p,error", [(0.1, ValueError), ("0", TypeError), (True, TypeError)])
def test_dropout(dropout_p, error):
    with pytest.raises(error, match="dropout_p must be"):
        attention(*qkv(), dropout_p=dropout_p)


def test_fewer_key_value_heads_need_enable_gqa():
    with pytest.raises(ValueError, match="query has 4 heads and key/value 2/2: pass enable_gqa=True"):
        attention(*qkv(kv_heads=2))


def test_heads_that_do_not_group():
    with pytest.raises(ValueError, match="query's head count must be a multiple of key's and "
                                         "value's .* got 4 and 3"):
        attention(*qkv(kv_heads=3), enable_gqa=True)


def test_errors_name_sdpas_arguments():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="value must be float16 or bfloat16, got torch.float32"):
        attention(q, k, v.float())


@pytest.mark.parametrize("argument,value", [("is_causal", 1), ("enable_gqa", "yes")])
def test_flags_must_be_bools(argument, value):
    with pytest.raises(TypeError, match=f"{argument} must be a bool"):
        attention(*qkv(), **{argument: value})


def test_inputs_that_require_grad_are_refused_until_there_is_a_backward():
    q, k, v = qkv()
    with pytest.raises(RuntimeError, match="query, value requires grad, but cuTile FMHA has no "
                                           "backward pass yet"):
        attention(q.requires_grad_(), k, v.requires_grad_())
    with torch.no_grad():  # inference on the same tensors gets as far as the device check
        with pytest.raises(ValueError, match="must be on a CUDA device"):
            attention(q, k, v)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("mask", [None, "is_causal", "upper_left", "lower_right"])
@pytest.mark.parametrize("q_len,k_len", [(300, 1000), (1000, 300)])
def test_matches_sdpa(mask, q_len, k_len):
    q, k, v = qkv(heads=8, kv_heads=2, q_len=q_len, k_len=k_len, head_dim=128, device="cuda")
    options = {"is_causal": True} if mask == "is_causal" else {"attn_mask": {
        None: None, "upper_left": causal_upper_left(q_len, k_len),
        "lower_right": causal_lower_right(q_len, k_len)}[mask]}
    causal = {None: False, "is_causal": True, "upper_left": "top_left",
              "lower_right": "bottom_right"}[mask]
    ours, lse = attention_with_lse(q, k, v, enable_gqa=True, **options)
    plain = attention(q, k, v, enable_gqa=True, **options)
    theirs = F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **options).nan_to_num(0.0)
    error, lse_error = reference_errors(ours, q, k, v, causal=causal, lse=lse)
    assert torch.equal(ours, plain), "the LSE variant computes another output"
    assert error <= 2 * reference_errors(theirs, q, k, v, causal=causal)[0] + 1e-3
    assert lse_error < 1e-4 and lse.shape == (2, 8, q_len) and lse.dtype == torch.float32
