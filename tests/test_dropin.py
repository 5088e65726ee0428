"""cutile_fmha.attention, the drop-in for F.scaled_dot_product_attention: what it refuses
and how it says so (no GPU needed: every check comes before the device check), and on the
GPU that it computes what SDPA computes."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from cutile_fmha import attention, attention_with_lse
from cutile_fmha import dropin
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.steps.reference import reference_errors, reference_gradients


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


@pytest.mark.parametrize("options,error,message", [
    (dict(window_size=(-2, 0)), ValueError, r"window_size's sides must be -1 \(unbounded\) or at "
                                            r"least 0, got \(-2, 0\)"),
    (dict(window_size=4), TypeError, r"window_size must be a pair of ints \(left, right\)"),
    (dict(window_size=(1.5, 0)), TypeError, "window_size must be a pair of ints"),
    (dict(window_size=(-1.0, -1.0)), TypeError, "window_size must be a pair of ints"),
    (dict(softcap=0.0), ValueError, r"softcap must be a positive finite number \(None: no cap\)"),
    (dict(softcap=-3.0), ValueError, "softcap must be a positive finite number"),
    (dict(softcap="30"), TypeError, "softcap must be a float or None, got str"),
    (dict(sinks=[0.0] * 4), TypeError, "sinks must be a torch.Tensor or None, got list"),
    (dict(sinks=torch.zeros(2)), ValueError, r"sinks must be a floating-point tensor of one "
                                             r"logit per query head, shape \(4,\)"),
    (dict(sinks=torch.zeros(4, dtype=torch.int32)), ValueError, "sinks must be a floating-point"),
])
def test_variant_arguments_are_checked(options, error, message):
    with pytest.raises(error, match=message):
        attention(*qkv(), **options)


def test_variants_run_head_dims_up_to_256():
    with pytest.raises(ValueError, match=r"window_size, softcap and sinks run head dims up to "
                                         r"256, got 512"):
        attention(*qkv(head_dim=512), softcap=30.0)


@pytest.mark.parametrize("q_dim,v_dim,message", [
    (100, 100, "or multiples of 8 up to 256 .*got 100 for query and key"),
    (96, 264, "got 264 for value"),
    (512, 256, "got 512 for query and key"),
])
def test_head_dims_past_the_padded_ones_are_refused(q_dim, v_dim, message):
    q, k, _ = qkv(head_dim=q_dim)
    v = torch.randn(*k.shape[:-1], v_dim, dtype=k.dtype)
    with pytest.raises(ValueError, match=message):
        attention(q, k, v)


@pytest.mark.parametrize("q_dim,v_dim", [(80, 80), (96, 96), (192, 192), (192, 128), (64, 32)])
def test_padded_head_dims_run_the_variants_kernel_with_gradients(q_dim, v_dim,
                                                                 kernels_on_the_cpu):
    """D 80, 96, 192 and value's head dim other than query's (DeepSeek's 192/128) go to
    step 9's code on padded tiles (the variants' kernel, with no variant), output value's
    head dim, and are differentiable: against float64 autograd (the kernels replaced by
    float64 on the CPU)."""
    from cutile_fmha.steps.reference import reference

    generator = torch.Generator().manual_seed(q_dim + v_dim)
    q, k = (torch.randn(2, h, 24, q_dim, generator=generator, dtype=torch.float64)
            for h in (4, 2))
    v = torch.randn(2, 2, 24, v_dim, generator=generator, dtype=torch.float64)
    grad = torch.randn(2, 4, 24, v_dim, generator=generator, dtype=torch.float64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention_with_lse(*leaves, is_causal=True, enable_gqa=True)
    assert out.shape == (2, 4, 24, v_dim) and lse.shape == (2, 4, 24)
    out.backward(grad)
    wide = [t.clone().requires_grad_() for t in (q, k, v)]
    expected, _ = reference(*wide, causal=True)
    expected.backward(grad)
    torch.testing.assert_close(out, expected.to(out.dtype))
    for mine, theirs in zip(leaves, wide):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-6)
    assert kernels_on_the_cpu == {"variants": 1, "backward": 1}


def test_no_variant_asked_is_the_plain_kernel(monkeypatch):
    """window_size=(-1, -1), softcap=None and sinks=None take the plain path."""
    monkeypatch.setattr(dropin, "run_forward", lambda *args: ("plain", None))
    monkeypatch.setattr(dropin, "run_variants", lambda *args: ("variants", None))
    assert attention(*qkv(), window_size=(-1, -1)) == "plain"
    assert attention(*qkv(), window_size=(5, -1)) == "variants"
    assert attention(*qkv(), sinks=torch.zeros(4)) == "variants"


VARIANT_OPTIONS = [{"sinks": True}, {"softcap": 5.0}, {"window_size": (5, 3)},
                   {"window_size": (9, 0), "softcap": 4.0, "sinks": True}]


@pytest.mark.parametrize("options", VARIANT_OPTIONS, ids=lambda o: "+".join(o))
def test_variants_gradients_match_float64_autograd(options, kernels_on_the_cpu):
    """attention() with the variants is differentiable: dQ, dK, dV through the backward
    with the softcap and window, on the LSE that holds the sinks, and dsinks, against
    autograd through the float64 reference (the kernels replaced by float64 on the CPU)."""
    from conftest import reference_with_variants

    from cutile_fmha.steps.variants import Variants

    generator = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, h, 24, 64, generator=generator, dtype=torch.float64)
               for h in (4, 2, 2))
    sinks, grad = torch.randn(4, generator=generator), torch.randn(2, 4, 24, 64,
                                                                    generator=generator)
    window = options.get("window_size")
    variants = Variants(window=window, softcap=options.get("softcap"),
                        sinks="sinks" in options)
    for causal in (False, True):
        leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
        attention(*leaves[:3], is_causal=causal, enable_gqa=True,
                  sinks=leaves[3] if variants.sinks else None,
                  window_size=window or (-1, -1), softcap=variants.softcap).backward(
            grad.double())
        wide = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
        out, _ = reference_with_variants(*wide[:3], offset=0, causal=causal, scale=64 ** -0.5,
                                         variants=variants,
                                         sinks=wide[3] if variants.sinks else None)
        out.backward(grad.double())
        for mine, theirs in list(zip(leaves, wide))[:4 if variants.sinks else 3]:
            torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=1e-5, atol=1e-6)
    assert kernels_on_the_cpu == {"variants": 2, "backward": 2}


def test_no_backward_past_head_dim_256():
    q, k, v, out = (torch.randn(1, 2, 8, 512) for _ in range(4))
    with pytest.raises(ValueError, match="the backward runs head dims up to 256, got 512"):
        attention_backward(q, k, v, out, torch.zeros(1, 2, 8), out, causal=True)


def test_checks_run_once_per_key_and_again_for_what_makes_another_key(monkeypatch):
    calls = []

    def check(tensor, flag):
        calls.append(flag)
        if not isinstance(flag, bool):
            raise TypeError("flag must be a bool")
        return flag

    checked, t = {}, torch.empty(2, 3)
    assert [dropin.checked_once(checked, check, (t, True), tensors=1) for _ in range(3)] == \
        [True] * 3
    assert calls == [True]
    with pytest.raises(TypeError):  # 1 == True, but is not a bool: its own key
        dropin.checked_once(checked, check, (t, 1), tensors=1)
    dropin.checked_once(checked, check, (t.t(), True), tensors=1)  # other strides
    with pytest.raises(TypeError):  # no key to make: checked on every call
        dropin.checked_once(checked, check, ([1], []), tensors=1)
    assert calls == [True, 1, True, []]
    monkeypatch.setattr(dropin, "MAX_CHECKED_KEYS", 2)
    dropin.checked_once(checked, check, (t[0], True), tensors=1)
    assert len(checked) == 1  # full: emptied before the new key


def test_plans_are_kept_for_a_bounded_number_of_shapes(monkeypatch):
    """A plan per shape key, as many as the checks keep: serving prefills of ever new
    lengths must not grow the plans without end."""
    class Plan:
        def without_tensors(self):
            return self

    monkeypatch.setattr(dropin, "build_plan", lambda *args, **kwargs: Plan())
    monkeypatch.setattr(dropin, "_PLANS", {})
    monkeypatch.setattr(dropin, "MAX_CHECKED_KEYS", 2)
    for length in (10, 11, 12, 11):
        q = torch.empty(1, 2, length, 64)
        dropin.plan_for(q, q, q, "none", 0.125, False)
        assert len(dropin._PLANS) <= 2
    assert dropin.plan_for(q, q, q, "none", 0.125, False)[1] is False  # 11: kept


def test_inputs_that_require_grad_are_checked_like_the_others():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        attention(q.requires_grad_(), k, v.requires_grad_(), is_causal=1)
    with pytest.raises(ValueError, match="must be on a CUDA device"):
        attention(q, k, v)


# (batch, heads, kv_heads, q_len, k_len, head_dim, value's head dim): no batch entry, no
# query row, no key (and no key with value's head dim other than query's)
NOTHING_TO_ATTEND = [(0, 4, 2, 24, 24, 64, 64), (2, 4, 2, 0, 24, 64, 64),
                     (2, 4, 2, 24, 0, 64, 64), (2, 4, 2, 24, 0, 96, 32)]


def check_nothing_to_attend(shape, device):
    """attention_with_lse on `shape` (NOTHING_TO_ATTEND) against SDPA's result: the same
    (empty or zero) output, an LSE of -inf (the sink's logit with sinks), zero gradients
    of every input's shape."""
    batch, heads, kv_heads, q_len, k_len, head_dim, value_dim = shape
    sizes = ((heads, q_len, head_dim), (kv_heads, k_len, head_dim), (kv_heads, k_len, value_dim))
    inputs = [torch.randn(batch, *size, dtype=torch.float16, device=device) for size in sizes]
    sinks = torch.randn(heads, device=device)
    for causal, with_sinks in ((False, False), (True, False), (True, True)):
        leaves = [t.clone().requires_grad_() for t in inputs + [sinks]]
        out, lse = attention_with_lse(*leaves[:3], is_causal=causal, enable_gqa=True,
                                      sinks=leaves[3] if with_sinks else None)
        theirs = F.scaled_dot_product_attention(*(t.float() for t in inputs), is_causal=causal,
                                                enable_gqa=True)
        assert out.dtype == torch.float16 and torch.equal(out.float(), theirs)
        expected_lse = sinks[None, :, None].expand(lse.shape) if with_sinks else \
            torch.full_like(lse, -math.inf)
        assert lse.shape == (batch, heads, q_len) and torch.equal(lse, expected_lse)
        out.backward(torch.randn_like(out))
        for leaf in leaves[:4 if with_sinks else 3]:
            assert torch.equal(leaf.grad, torch.zeros_like(leaf))


@pytest.mark.parametrize("shape", NOTHING_TO_ATTEND)
def test_nothing_to_attend_gives_sdpas_result_with_no_launch(shape, monkeypatch, kernel_calls):
    monkeypatch.setattr(dropin, "_check_devices", lambda named: None)  # CPU tensors
    check_nothing_to_attend(shape, "cpu")
    assert not kernel_calls


@pytest.mark.parametrize("change,error,message", [
    (lambda t: t.float(), TypeError, "query must be float16 or bfloat16"),
    (lambda t: t[..., :50], ValueError, "got 50 for query and key"),
    (lambda t: t, ValueError, "query must be on a CUDA device"),
])
def test_nothing_to_attend_is_checked_as_any_call(change, error, message):
    q, k, v = qkv(q_len=0)
    with pytest.raises(error, match=message):
        attention(change(q), change(k), v)


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", NOTHING_TO_ATTEND)
def test_nothing_to_attend_on_the_gpu(shape):
    check_nothing_to_attend(shape, "cuda")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("mask", [None, "is_causal", "upper_left", "lower_right"])
@pytest.mark.parametrize("q_len,k_len", [(300, 1000), (1000, 300)])
@pytest.mark.parametrize("head_dim", [128, 576])  # steps 1-9, and the head dim tiled
def test_matches_sdpa(mask, q_len, k_len, head_dim):
    q, k, v = qkv(heads=8, kv_heads=2, q_len=q_len, k_len=k_len, head_dim=head_dim,
                  device="cuda")
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


def test_custom_ops_give_torch_compile_their_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 8, 100, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 2, 120, 64, dtype=torch.bfloat16)
        out, lse = torch.ops.cutile_fmha.forward(q, k, k, "bottom_right", 0.125, True)
        assert out.shape == q.shape and out.dtype == q.dtype
        assert lse.shape == (2, 8, 100) and lse.dtype == torch.float32
        assert torch.ops.cutile_fmha.forward(q, k, k, "none", 0.125, False)[1].numel() == 0
        for sinks in (None, torch.empty(8)):
            dq, dk, dv, dsinks = torch.ops.cutile_fmha.backward(out, q, k, k, out, lse, sinks,
                                                                "none", 0.125, 64, 0, 30.0)
            assert (dq.shape, dk.shape, dv.shape) == (q.shape, k.shape, k.shape)
            assert dsinks.shape == ((0,) if sinks is None else (8,))


def cpu_inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(3)
    q, k, v, grad_out = (torch.randn(1, h, 24, 64, generator=generator, dtype=dtype)
                         for h in (4, 2, 2, 4))
    return q, k, v, grad_out


def test_gradients_flow_through_the_custom_ops(kernels_on_the_cpu):
    q, k, v, grad_out = cpu_inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = attention(*leaves, attn_mask=causal_lower_right(24, 24), enable_gqa=True, scale=0.2)
    out.backward(grad_out)
    want = reference_gradients(q, k, v, grad_out, causal="bottom_right", scale=0.2)
    for leaf, expected in zip(leaves, want):
        torch.testing.assert_close(leaf.grad.double(), expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(attention(q, k, v, enable_gqa=True, scale=0.2,
                                             attn_mask=causal_lower_right(24, 24)), out.detach())
    out, lse = attention_with_lse(*leaves, is_causal=True, enable_gqa=True)
    assert out.requires_grad and not lse.requires_grad and lse.shape == (1, 4, 24)


def test_torch_compile_traces_one_graph_through_the_custom_ops(kernels_on_the_cpu):
    q, k, v, grad_out = cpu_inputs()

    def block(q, k, v):
        return attention(q, k, v, is_causal=True, enable_gqa=True) * 2

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    results = []
    for fn in (block, compiled):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        out.backward(grad_out)
        results.append([out.detach()] + [leaf.grad for leaf in leaves])
    for eager, traced in zip(*results):
        torch.testing.assert_close(traced, eager)
    assert kernels_on_the_cpu == {"forward": 2, "backward": 2}
