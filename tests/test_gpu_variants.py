"""Sliding window, logit softcap and attention sinks on the GPU: attention() against a
float64 reference, alone and combined, with GQA, both causal alignments, key and query
lengths that are no tile multiple, and rows whose window holds no key.

Where SDPA can express the case (a window is a boolean mask) the error must be within
twice SDPA's own against the same reference; softcap and sinks it cannot express, and
there the bound is a fixed fraction of the largest |output| (the decode tests' bound)."""

import math

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right

from cutile_fmha import attention, attention_with_lse
from cutile_fmha.steps.reference import visible_keys

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 2e-2}  # of the largest |output|
EPSILON = {torch.float16: 1e-3, torch.bfloat16: 4e-3}


def visible(q_len, k_len, offset, causal, window, device):
    """(q_len, k_len) bool: which keys each row sees; offset: the diagonal's; window as
    flash-attn's window_size."""
    return visible_keys(q_len, k_len, offset=offset, causal=causal, device=device,
                        window=tuple(None if side == -1 else side for side in window))


def reference(q, k, v, seen, scale, softcap=None, sinks=None):
    """(out, lse) in float64."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, 1) for t in (k, v))
    scores = q.double() @ k.transpose(-1, -2) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~seen, -math.inf)
    if sinks is not None:
        sink = sinks.double()[None, :, None, None].expand(*scores.shape[:-1], 1)
        lse = torch.logsumexp(torch.cat([scores, sink], -1), -1)
    else:
        lse = torch.logsumexp(scores, -1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)
    return weights @ v, lse


def inputs(batch, heads, kv_heads, q_len, k_len, head_dim, dtype, seed):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(batch, h, n, head_dim, generator=generator, device="cuda",
                        dtype=DTYPES[dtype]) for h, n in ((heads, q_len), (kv_heads, k_len),
                                                           (kv_heads, k_len))]


CASES = [  # (causal, window, q_len, k_len): causal True top-left, "bottom_right", or False
    (True, (100, -1), 777, 777), (True, (0, -1), 300, 300), (False, (64, 64), 500, 500),
    (False, (-1, 17), 333, 333), (False, (40, 0), 200, 90), ("bottom_right", (128, -1), 150, 700),
    (True, (256, -1), 1030, 1030), ("bottom_right", (5, -1), 400, 100),
]


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal,window,q_len,k_len", CASES)
def test_sliding_window_matches_float64_within_twice_sdpas_error(head_dim, causal, window,
                                                                  q_len, k_len):
    dtype = "bfloat16" if head_dim == 128 else "float16"
    q, k, v = inputs(2, 8, 2, q_len, k_len, head_dim, dtype, seed=q_len + k_len + head_dim)
    offset = k_len - q_len if causal == "bottom_right" else 0
    seen = visible(q_len, k_len, offset, bool(causal), window, q.device)
    scale = head_dim ** -0.5
    mask = causal_lower_right(q_len, k_len) if causal == "bottom_right" else None
    out, lse = attention_with_lse(q, k, v, attn_mask=mask, is_causal=causal is True,
                                  enable_gqa=True, window_size=window)
    expected, expected_lse = reference(q, k, v, seen, scale)
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=seen, enable_gqa=True).nan_to_num(0.0)  # rows seeing nothing: 0
    error = (out.double() - expected).abs().max()
    sdpa_error = (sdpa.double() - expected).abs().max()
    assert error <= 2 * sdpa_error + EPSILON[q.dtype], (error, sdpa_error)
    sees_none = ~seen.any(-1)
    assert torch.equal(out[:, :, sees_none], torch.zeros_like(out[:, :, sees_none]))
    assert torch.isneginf(lse[:, :, sees_none]).all()
    finite = ~sees_none
    assert torch.allclose(lse[:, :, finite].double(), expected_lse[:, :, finite], atol=1e-3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("case", ["softcap", "sinks", "softcap+window", "sinks+causal",
                                  "all+gqa"])
def test_softcap_and_sinks_match_float64(dtype, head_dim, case):
    heads, kv_heads = (8, 2) if "gqa" in case else (4, 4)
    q_len = k_len = 413
    q, k, v = inputs(2, heads, kv_heads, q_len, k_len, head_dim, dtype, seed=head_dim)
    q = q * 3  # scores of several units, so that a cap of 5 bites
    causal = "causal" in case or "all" in case
    window = (61, -1) if "window" in case or "all" in case else (-1, -1)
    softcap = 5.0 if "softcap" in case or "all" in case else None
    sinks = torch.randn(heads, device="cuda") * 2 if "sinks" in case or "all" in case else None
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=True,
                                  window_size=window, softcap=softcap, sinks=sinks)
    seen = visible(q_len, k_len, 0, causal, window, q.device)
    expected, expected_lse = reference(q, k, v, seen, head_dim ** -0.5, softcap, sinks)
    largest = expected.abs().max()
    assert (out.double() - expected).abs().max() <= TOLERANCE[q.dtype] * largest
    assert torch.allclose(lse.double(), expected_lse, atol=2e-3)
    assert torch.equal(attention(q, k, v, is_causal=causal, enable_gqa=True,
                                 window_size=window, softcap=softcap, sinks=sinks), out)


def test_sinks_take_the_mass_of_rows_that_see_no_key():
    q, k, v = inputs(1, 2, 2, 200, 64, 64, "float16", seed=5)
    sinks = torch.tensor([0.5, -1.0], device="cuda")
    out, lse = attention_with_lse(q, k, v, attn_mask=causal_lower_right(200, 64), sinks=sinks)
    assert not out[:, :, :136].any()  # rows before the first key: all on the sink
    assert torch.allclose(lse[0, :, :136], sinks[:, None].expand(2, 136))


def test_a_window_wider_than_the_sequence_is_plain_attention():
    q, k, v = inputs(1, 4, 4, 300, 300, 128, "bfloat16", seed=9)
    assert torch.equal(attention(q, k, v, is_causal=True, window_size=(300, -1)),
                       attention(q, k, v, is_causal=True, window_size=(1000, 0)))
    plain = attention(q, k, v, is_causal=True)
    assert (attention(q, k, v, is_causal=True, window_size=(300, -1)).float()
            - plain.float()).abs().max() <= 1e-2


GRADIENT_CASES = {  # name: (causal, window, softcap, sinks, q_len, k_len, kv_heads)
    "window": (False, (70, 30), None, False, 333, 333, 4),
    "window+causal+gqa": (True, (100, -1), None, False, 333, 333, 2),
    "window+bottom_right": ("bottom_right", (90, -1), None, False, 150, 400, 2),
    "softcap": (False, (-1, -1), 5.0, False, 333, 333, 2),
    "softcap+causal": (True, (-1, -1), 5.0, False, 333, 333, 4),
    "sinks+causal": (True, (-1, -1), None, True, 333, 333, 2),
    "all": (True, (61, -1), 5.0, True, 413, 413, 2),
}


def relative_gradient_errors(leaves, wide, names=("dq", "dk", "dv", "dsinks")) -> dict:
    """Per gradient, its largest error against the float64 one over the latter's largest
    entry."""
    return {name: ((mine.grad.double() - theirs.grad).abs().max()
                   / theirs.grad.abs().max()).item()
            for name, mine, theirs in zip(names, leaves, wide)}


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
def test_variants_gradients_match_float64_autograd(case, head_dim):
    """dQ, dK, dV (and dsinks) of attention() with the window, softcap and sinks, GQA, both
    alignments, lengths that are no tile multiple, against autograd through the float64
    reference. Where SDPA can express the case (a window is a boolean mask) within twice
    its error on the same inputs; else within 2% of each gradient's largest entry."""
    causal, window, softcap, with_sinks, q_len, k_len, kv_heads = GRADIENT_CASES[case]
    dtype = "bfloat16" if head_dim == 128 else "float16"
    q, k, v = inputs(2, 8, kv_heads, q_len, k_len, head_dim, dtype, seed=head_dim + q_len)
    q = q * 3 if softcap else q  # scores of several units, so that a cap of 5 bites
    sinks = torch.randn(8, device="cuda") if with_sinks else None
    grad = torch.randn_like(q)
    offset = k_len - q_len if causal == "bottom_right" else 0
    seen = visible(q_len, k_len, offset, bool(causal), window, q.device)
    assert seen.any(-1).all()  # every row sees a key: SDPA's gradients are finite
    mask = causal_lower_right(q_len, k_len) if causal == "bottom_right" else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + \
        ([sinks.clone().requires_grad_()] if with_sinks else [])
    attention(*leaves[:3], attn_mask=mask, is_causal=causal is True, enable_gqa=True,
              window_size=window, softcap=softcap,
              sinks=leaves[3] if with_sinks else None).backward(grad)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    expected, _ = reference(*wide[:3], seen, head_dim ** -0.5, softcap,
                            wide[3] if with_sinks else None)
    expected.backward(grad.double())
    errors = relative_gradient_errors(leaves, wide)
    if softcap is None and not with_sinks:
        sdpa = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        torch.nn.functional.scaled_dot_product_attention(
            *sdpa, attn_mask=seen, enable_gqa=True).backward(grad)
        sdpa_errors = relative_gradient_errors(sdpa, wide)
        for name, error in sdpa_errors.items():
            assert errors[name] <= 2 * error + 1e-3, (name, errors, sdpa_errors)
    else:
        assert max(errors.values()) <= 2e-2, errors


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("case", ["all", "window+bottom_right", "softcap"])
def test_variants_gradients_with_dq_added_atomically(dq_added_atomically, case, head_dim):
    """As above, with dQ added by the dK/dV kernel ("dkdv_dq", at D=64 on its softcap
    tiles where the softcap is on) on every grid."""
    test_variants_gradients_match_float64_autograd(case, head_dim)


def test_variants_past_32_bit_strides_run_in_groups_as_separate_calls(large_gpu_memory):
    """The window, softcap and sinks together on D=96 (split columns), 6144 query heads
    to 1536 K/V heads of 4096 rows: q holds 2.4 x 10^9 elements, past cuTile's 32-bit
    strides in one launch, so attention() and its backward run two groups of 768 K/V
    heads on views. Out, LSE, dk and dv equal calls on each half's heads apart bit for
    bit; dq and dsinks, summed in other orders (dQ's atomics, the sinks' sums over other
    shapes), within 1e-2 of their largest entries; the heads at the groups' edges match
    float64 autograd within 2% of each gradient's largest entry."""
    heads, kv_heads, n, window, softcap = 6144, 1536, 4096, (1024, -1), 5.0
    q, k, v = inputs(1, heads, kv_heads, n, n, 96, "bfloat16", seed=96)
    q.mul_(3)  # scores of several units, so that the cap bites
    assert q.numel() > 2 ** 31
    generator = torch.Generator(device="cuda").manual_seed(97)
    sinks = torch.randn(heads, generator=generator, device="cuda")
    grad = torch.randn(q.shape, generator=generator, device="cuda", dtype=q.dtype)

    def forward_backward(q, k, v, sinks, grad):
        leaves = [t.detach().requires_grad_() for t in (q, k, v, sinks)]
        out, lse = attention_with_lse(*leaves[:3], is_causal=True, enable_gqa=True,
                                      window_size=window, softcap=softcap, sinks=leaves[3])
        out.backward(grad)
        return out.detach(), lse, *(t.grad for t in leaves)

    whole = forward_backward(q, k, v, sinks, grad)
    for half in range(2):
        rows, keys = slice(half * heads // 2, (half + 1) * heads // 2), \
            slice(half * kv_heads // 2, (half + 1) * kv_heads // 2)
        apart = forward_backward(q[:, rows], k[:, keys], v[:, keys], sinks[rows], grad[:, rows])
        for name, got, want, side in zip(("out", "lse", "dq", "dk", "dv", "dsinks"), whole,
                                         apart, (rows, rows, rows, keys, keys, rows)):
            got = got[side] if name == "dsinks" else got[:, side]
            if name in ("dq", "dsinks"):
                assert (got - want).abs().max() <= 1e-2 * want.abs().max(), name
            else:
                assert torch.equal(got, want), name
        del apart
    seen = visible(n, n, 0, True, window, q.device)
    for kv_head in (kv_heads // 2 - 1, kv_heads // 2):  # the groups' last and first
        rows, keys = slice(kv_head * 4, kv_head * 4 + 4), slice(kv_head, kv_head + 1)
        wide = [t.detach().double().requires_grad_()
                for t in (q[:, rows], k[:, keys], v[:, keys], sinks[rows])]
        expected, _ = reference(*wide[:3], seen, 96 ** -0.5, softcap, wide[3])
        expected.backward(grad[:, rows].double())
        ours = (whole[0][:, rows], whole[2][:, rows], whole[3][:, keys], whole[4][:, keys],
                whole[5][rows])
        for got, want in zip(ours, (expected, *(t.grad for t in wide))):
            assert (got.double() - want).abs().max() <= 2e-2 * want.abs().max()


def test_variants_compile_with_torch_compile():
    q, k, v = inputs(1, 4, 2, 256, 256, 128, "bfloat16", seed=2)
    sinks = torch.randn(4, device="cuda")

    def layer(q, k, v):
        return attention(q, k, v, is_causal=True, enable_gqa=True, window_size=(64, 0),
                         softcap=20.0, sinks=sinks)

    compiled = torch.compile(layer, fullgraph=True)
    assert torch.equal(compiled(q, k, v), layer(q, k, v))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", ["window", "softcap+sinks", "all"])
def test_packed_sequences_take_the_variants_aligned_to_each_last_key(head_dim, causal, case):
    """attention_varlen with lengths 0, 1, no tile multiple, more queries than keys and
    fewer, each sequence against a float64 reference with its diagonal at its last key."""
    from cutile_fmha import attention_varlen

    q_lens, k_lens = [300, 0, 1, 77, 130, 64], [300, 5, 40, 0, 200, 30]
    heads, kv_heads = 8, 2
    generator = torch.Generator(device="cuda").manual_seed(head_dim + len(case))
    q, k, v = (torch.randn(sum(lens), h, head_dim, generator=generator, device="cuda",
                           dtype=torch.bfloat16)
               for lens, h in ((q_lens, heads), (k_lens, kv_heads), (k_lens, kv_heads)))
    window = (50, -1 if causal else 20) if case in ("window", "all") else (-1, -1)
    softcap = 8.0 if "softcap" in case or case == "all" else None
    sinks = torch.randn(heads, device="cuda") if "sinks" in case or case == "all" else None
    cu_q, cu_k = (torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
                  for lens in (q_lens, k_lens))
    out, lse = attention_varlen(q * 2, k, v, cu_q, cu_k, max(q_lens), max(k_lens),
                                is_causal=causal, return_lse=True, window_size=window,
                                softcap=softcap, sinks=sinks)
    for s, (q_len, k_len) in enumerate(zip(q_lens, k_lens)):
        if q_len == 0:
            continue
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        one = [t[part].transpose(0, 1)[None] for t, part in ((q * 2, rows), (k, keys), (v, keys))]
        seen = visible(q_len, k_len, k_len - q_len, causal, window, q.device)
        expected, expected_lse = reference(*one, seen, head_dim ** -0.5, softcap, sinks)
        got = out[rows].transpose(0, 1)[None].double()
        assert (got - expected).abs().max() <= TOLERANCE[q.dtype] * max(expected.abs().max(), 1), s
        assert torch.allclose(lse[:, rows].double(), expected_lse[0], atol=2e-3), s


@pytest.mark.parametrize("head_dim,with_variants", [(128, True), (96, True), (96, False)])
@pytest.mark.parametrize("q_len", [1, 4])
def test_kvcache_takes_the_variants_on_a_dense_cache(q_len, head_dim, with_variants):
    """attention_with_kvcache with a window, softcap and sinks, at head dims on whole and
    padded tiles (96 on 128 columns): ragged lengths with left padding, against float64 per
    sequence."""
    from cutile_fmha import attention_with_kvcache

    generator = torch.Generator(device="cuda").manual_seed(q_len)
    heads, kv_heads, capacity = 8, 2, 700
    query = torch.randn(3, heads, q_len, head_dim, generator=generator, device="cuda",
                        dtype=torch.bfloat16)
    cache = [torch.randn(3, kv_heads, capacity, head_dim, generator=generator, device="cuda",
                         dtype=torch.bfloat16) for _ in range(2)]
    starts = torch.tensor([0, 37, 600], dtype=torch.int32, device="cuda")
    ends = torch.tensor([700, 513, 600], dtype=torch.int32, device="cuda")
    sinks = torch.randn(heads, device="cuda") if with_variants else None
    window, softcap = ((100, 0), 10.0) if with_variants else ((-1, -1), None)
    out, lse = attention_with_kvcache(query, *cache, ends, cache_leftpad=starts,
                                      window_size=window, softcap=softcap, sinks=sinks,
                                      return_lse=True)
    for b, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        k, v = (t[b:b + 1, :, start:end] for t in cache)
        seen = visible(q_len, end - start, end - start - q_len, True, window, query.device)
        expected, expected_lse = reference(query[b:b + 1], k, v, seen, head_dim ** -0.5,
                                           softcap, sinks)
        assert (out[b:b + 1].double() - expected).abs().max() <= \
            TOLERANCE[query.dtype] * max(expected.abs().max(), 1)
        assert torch.allclose(lse[b:b + 1].double(), expected_lse, atol=2e-3)


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("case", ["window+softcap", "all"])
def test_packed_sequences_gradients_with_the_variants(head_dim, causal, case):
    """attention_varlen's dq, dk, dv (and dsinks) with the window and softcap, GQA, each
    sequence's window at its last key, against autograd through the float64 reference per
    sequence: lengths 0, 1 and no tile multiple, and with sinks (which give rows that see
    no key a finite LSE) more queries than keys."""
    from cutile_fmha import attention_varlen

    with_sinks = case == "all"
    q_lens, k_lens = ([300, 0, 1, 77, 130, 64], [300, 5, 40, 0, 200, 30]) if with_sinks else \
        ([300, 0, 1, 77, 130, 64], [300, 5, 40, 90, 200, 64])
    heads, kv_heads = 8, 2
    generator = torch.Generator(device="cuda").manual_seed(head_dim + len(case) + causal)
    q, k, v = (torch.randn(sum(lens), h, head_dim, generator=generator, device="cuda",
                           dtype=torch.bfloat16)
               for lens, h in ((q_lens, heads), (k_lens, kv_heads), (k_lens, kv_heads)))
    q = q * 2
    window, softcap = (50, -1 if causal else 20), 8.0
    sinks = torch.randn(heads, device="cuda") if with_sinks else None
    grad = torch.randn_like(q)
    cu_q, cu_k = (torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
                  for lens in (q_lens, k_lens))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)] + \
        ([sinks.clone().requires_grad_()] if with_sinks else [])
    attention_varlen(*leaves[:3], cu_q, cu_k, max(q_lens), max(k_lens), is_causal=causal,
                     window_size=window, softcap=softcap,
                     sinks=leaves[3] if with_sinks else None).backward(grad)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    for s, (q_len, k_len) in enumerate(zip(q_lens, k_lens)):
        if q_len == 0 or (k_len == 0 and not with_sinks):
            continue
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        one = [t[part].transpose(0, 1)[None]
               for t, part in ((wide[0], rows), (wide[1], keys), (wide[2], keys))]
        seen = visible(q_len, k_len, k_len - q_len, causal, window, q.device)
        expected, _ = reference(*one, seen, head_dim ** -0.5, softcap,
                                wide[3] if with_sinks else None)
        expected.backward(grad[rows].transpose(0, 1)[None].double())
    errors = relative_gradient_errors(leaves, wide)
    assert max(errors.values()) <= 2e-2, errors


@pytest.mark.parametrize("causal", [True, False])
def test_packed_sequences_gradients_with_the_variants_and_dq_added_atomically(
        dq_added_atomically, causal):
    test_packed_sequences_gradients_with_the_variants(64, causal, "all")


HEAD_DIM_CASES = [(80, 80), (96, 96), (160, 160), (192, 192), (192, 128), (32, 32), (64, 128)]


@pytest.mark.parametrize("q_dim,v_dim", HEAD_DIM_CASES)
@pytest.mark.parametrize("causal", [True, False, "bottom_right"])
def test_padded_head_dims_match_float64_within_twice_sdpas_error(q_dim, v_dim, causal):
    """D 80, 96, 160, 192 and value's head dim other than query's (step 9's code on Q and K
    cut in two column tiles, or zero-padded ones): output, LSE and dq, dk, dv against float64 autograd, GQA, lengths that are no
    tile multiple, each within twice SDPA's error on the same inputs."""
    q_len, k_len = (333, 333) if causal != "bottom_right" else (150, 400)
    dtype = torch.bfloat16 if q_dim % 32 else torch.float16
    generator = torch.Generator(device="cuda").manual_seed(q_dim + v_dim)
    q, k, v = (torch.randn(2, h, n, d, generator=generator, device="cuda", dtype=dtype)
               for h, n, d in ((8, q_len, q_dim), (2, k_len, q_dim), (2, k_len, v_dim)))
    grad = torch.randn(2, 8, q_len, v_dim, generator=generator, device="cuda", dtype=dtype)
    mask = causal_lower_right(q_len, k_len) if causal == "bottom_right" else None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = attention_with_lse(*leaves, attn_mask=mask, is_causal=causal is True,
                                  enable_gqa=True)
    assert out.shape == (2, 8, q_len, v_dim)
    out.backward(grad)
    seen = visible(q_len, k_len, k_len - q_len if mask is not None else 0, bool(causal),
                   (-1, -1), q.device)
    wide = [t.detach().double().requires_grad_() for t in (q, k, v)]
    expected, expected_lse = reference(*wide, seen, q_dim ** -0.5)
    expected.backward(grad.double())
    sdpa = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sdpa_out = torch.nn.functional.scaled_dot_product_attention(*sdpa, attn_mask=seen,
                                                                enable_gqa=True)
    sdpa_out.backward(grad)
    error = (out.double() - expected).abs().max()
    sdpa_error = (sdpa_out.double() - expected).abs().max()
    assert error <= 2 * sdpa_error + EPSILON[dtype], (error, sdpa_error)
    assert torch.allclose(lse.double(), expected_lse.detach(), atol=1e-3)
    errors, sdpa_errors = (relative_gradient_errors(got, wide) for got in (leaves, sdpa))
    for name, error in errors.items():
        assert error <= 2 * sdpa_errors[name] + 1e-3, (name, errors, sdpa_errors)


@pytest.mark.parametrize("q_dim,v_dim", [(96, 96), (192, 128)])
def test_padded_head_dims_with_the_variants_and_packed_sequences(q_dim, v_dim):
    """attention_varlen at D 96 and 192/128 with the window, softcap and sinks: output and
    gradients against float64 autograd per sequence (lengths 0, 1, no tile multiple)."""
    from cutile_fmha import attention_varlen

    q_lens, k_lens = [300, 0, 1, 77, 130], [300, 5, 40, 90, 200]
    generator = torch.Generator(device="cuda").manual_seed(q_dim)
    q, k, v = (torch.randn(sum(lens), h, d, generator=generator, device="cuda",
                           dtype=torch.bfloat16)
               for lens, h, d in ((q_lens, 8, q_dim), (k_lens, 2, q_dim), (k_lens, 2, v_dim)))
    q = q * 2
    sinks = torch.randn(8, device="cuda")
    grad = torch.randn(sum(q_lens), 8, v_dim, generator=generator, device="cuda",
                       dtype=torch.bfloat16)
    cu_q, cu_k = (torch.tensor([0] + lens, device="cuda").cumsum(0).to(torch.int32)
                  for lens in (q_lens, k_lens))
    leaves = [t.clone().requires_grad_() for t in (q, k, v, sinks)]
    out = attention_varlen(*leaves[:3], cu_q, cu_k, max(q_lens), max(k_lens), is_causal=True,
                           window_size=(50, 0), softcap=8.0, sinks=leaves[3])
    assert out.shape == (sum(q_lens), 8, v_dim)
    out.backward(grad)
    wide = [t.detach().double().requires_grad_() for t in leaves]
    for s, (q_len, k_len) in enumerate(zip(q_lens, k_lens)):
        if q_len == 0:
            continue
        rows, keys = slice(cu_q[s], cu_q[s + 1]), slice(cu_k[s], cu_k[s + 1])
        one = [t[part].transpose(0, 1)[None]
               for t, part in ((wide[0], rows), (wide[1], keys), (wide[2], keys))]
        seen = visible(q_len, k_len, k_len - q_len, True, (50, -1), q.device)
        expected, _ = reference(*one, seen, q_dim ** -0.5, 8.0, wide[3])
        got = out[rows].transpose(0, 1)[None].double()
        assert (got - expected).abs().max() <= TOLERANCE[q.dtype] * expected.abs().max(), s
        expected.backward(grad[rows].transpose(0, 1)[None].double())
    errors = relative_gradient_errors(leaves, wide)
    assert max(errors.values()) <= 2e-2, errors
