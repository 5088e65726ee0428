"""Variable-length batches on the GPU: attention_varlen and its launcher against a float64
reference computed sequence by sequence.

Length mixes include empty sequences, length 1, lengths that are no tile multiple, more
queries than keys and fewer; outputs, LSE and gradients are poisoned with NaN before the
launch (the launcher's `fill`), so a row never written fails. The bar is the dense tests':
at most twice SDPA's own error on the same sequences, plus a small epsilon.
"""

import math

import pytest
import torch

from cutile_fmha import attention_varlen
from cutile_fmha.assets.measure import DTYPES, TOLERANCE_EPSILON, sdpa
from cutile_fmha.steps.reference import reference
from cutile_fmha.steps.varlen import SequenceBounds, varlen_backward, varlen_forward

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

NAN = float("nan")
# (q_len, k_len) per sequence.
SELF_ATTENTION = [(0, 0), (1, 1), (17, 17), (300, 300), (1000, 1000), (129, 129), (64, 64)]
CROSS = [(5, 300), (300, 5), (0, 7), (7, 0), (128, 256), (333, 111), (1, 1000)]


def packed_inputs(lengths, heads, kv_heads, head_dim, dtype, seed):
    """query, key, value, grad_out packed as flash-attn packs them, and cu_seqlens."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    total_q, total_k = (sum(pair[i] for pair in lengths) for i in (0, 1))

    def randn(rows, h):
        return torch.randn(rows, h, head_dim, generator=generator, device="cuda",
                           dtype=DTYPES[dtype])

    def cumulative(i):
        return torch.tensor([0] + [pair[i] for pair in lengths], device="cuda").cumsum(0) \
            .to(torch.int32)

    return (randn(total_q, heads), randn(total_k, kv_heads), randn(total_k, kv_heads),
            randn(total_q, heads), cumulative(0), cumulative(1))


def per_sequence(tensor, cu_seqlens):
    """(1, heads, rows, D) views of each sequence's rows of a packed tensor."""
    bounds = cu_seqlens.tolist()
    return [tensor[start:end].transpose(0, 1)[None] for start, end in zip(bounds, bounds[1:])]


def expected(q, k, v, cu_q, cu_k, causal):
    """Per sequence: float64 (out, lse) and SDPA's output (None where SDPA cannot run)."""
    results = []
    for qs, ks, vs in zip(per_sequence(q, cu_q), per_sequence(k, cu_k), per_sequence(v, cu_k)):
        alignment = "bottom_right" if causal else False
        if qs.shape[2] == 0:
            results.append(None)
            continue
        if ks.shape[2] == 0:  # no keys: zeros, LSE -inf
            zeros = torch.zeros_like(qs, dtype=torch.float64)
            results.append((zeros, torch.full(qs.shape[:-1], -math.inf, device="cuda"), zeros))
            continue
        want_out, want_lse = reference(qs, ks, vs, causal=alignment)
        theirs = sdpa(qs, ks, vs, causal=alignment).double()
        if causal and qs.shape[2] > ks.shape[2]:  # rows that see no key: SDPA gives NaN
            theirs[:, :, :qs.shape[2] - ks.shape[2]] = 0
        results.append((want_out, want_lse, theirs))
    return results


def max_error(got, want) -> float:
    error = (got.double() - want).abs()
    return error.masked_fill(torch.isneginf(got) & torch.isneginf(want), 0).max().item()


def check_forward(lengths, heads, kv_heads, head_dim, dtype, causal, seed):
    q, k, v, _, cu_q, cu_k = packed_inputs(lengths, heads, kv_heads, head_dim, dtype, seed)
    views = [t.transpose(0, 1)[None] for t in (q, k, v)]
    out, lse = varlen_forward(*views, SequenceBounds.packed(cu_q, cu_k),
                              max(pair[0] for pair in lengths), causal=causal,
                              scale=1 / math.sqrt(head_dim), with_lse=True, fill=NAN)
    ours, bar, lse_error = 0.0, 0.0, 0.0
    for got, got_lse, want in zip(per_sequence(out[0].transpose(0, 1), cu_q),
                                  per_sequence(lse[0].transpose(0, 1)[..., None], cu_q),
                                  expected(q, k, v, cu_q, cu_k, causal)):
        if want is None:
            continue
        assert not got.isnan().any() and not got_lse.isnan().any(), "a row never written"
        ours = max(ours, max_error(got, want[0]))
        bar = max(bar, max_error(want[2].to(q.dtype), want[0]))
        lse_error = max(lse_error, max_error(got_lse[..., 0], want[1]))
    assert ours <= 2 * bar + TOLERANCE_EPSILON[q.dtype], f"max error {ours:.2e}, SDPA's {bar:.2e}"
    assert lse_error <= 1e-4, f"log-sum-exp off by {lse_error:.2e}"
    return out, lse


FORWARD_CASES = [  # (lengths, heads, kv_heads, head_dim, dtype)
    *[(SELF_ATTENTION, 4, 4, d, dtype) for d in (64, 128, 256)
      for dtype in ("float16", "bfloat16")],
    (CROSS, 4, 4, 128, "float16"),
    (CROSS, 8, 2, 64, "bfloat16"),
    (CROSS, 8, 1, 256, "float16"),
    (SELF_ATTENTION, 16, 4, 128, "bfloat16"),
    # Past D=256: steps 10-11's query tiles (sm_90: step 11 at 320 and 512, step 10 at 640).
    (SELF_ATTENTION, 4, 2, 320, "float16"),
    (CROSS, 4, 4, 512, "bfloat16"),
    (CROSS, 2, 1, 640, "float16"),
]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths,heads,kv_heads,head_dim,dtype", FORWARD_CASES)
def test_forward_matches_float64_per_sequence(lengths, heads, kv_heads, head_dim, dtype, causal):
    check_forward(lengths, heads, kv_heads, head_dim, dtype, causal, seed=head_dim + heads)


def reference_gradients(q, k, v, grad_out, cu_q, cu_k, causal):
    """Per sequence (dq, dk, dv) in float64, in closed form (rows that see no key have no
    gradient, and autograd through their -inf log-sum-exp would give NaN)."""
    grads = []
    for qs, ks, vs, dos in zip(per_sequence(q, cu_q), per_sequence(k, cu_k),
                               per_sequence(v, cu_k), per_sequence(grad_out, cu_q)):
        group = qs.shape[1] // ks.shape[1]
        qd, kd, vd, dod = (t.double() for t in (qs, ks, vs, dos))
        kd, vd = (t.repeat_interleave(group, dim=1) for t in (kd, vd))
        out, lse = reference(qs, ks, vs, causal="bottom_right" if causal else False)
        p = torch.exp(qd @ kd.transpose(-1, -2) / math.sqrt(q.shape[-1]) - lse[..., None])
        if causal:
            rows = torch.arange(qs.shape[2], device="cuda")[:, None]
            keys = torch.arange(ks.shape[2], device="cuda")[None, :]
            p = p.masked_fill(keys > rows + ks.shape[2] - qs.shape[2], 0.0)
        p = p.nan_to_num(0.0)
        ds = p * (dod @ vd.transpose(-1, -2) - (dod * out).sum(-1, keepdim=True))
        scale = 1 / math.sqrt(q.shape[-1])
        dq, dk = (ds @ kd) * scale, (ds.transpose(-1, -2) @ qd) * scale
        dv = p.transpose(-1, -2) @ dod
        grads.append((dq, *(t.unflatten(1, (-1, group)).sum(2) for t in (dk, dv))))
    return grads


BACKWARD_CASES = [
    *[(SELF_ATTENTION, 4, 4, d, dtype) for d in (64, 128, 256)
      for dtype in ("float16", "bfloat16")],
    (CROSS, 8, 2, 128, "float16"),
    (CROSS, 8, 1, 64, "bfloat16"),
]


def sdpa_gradients(q, k, v, grad_out, cu_q, cu_k, causal):
    """Per sequence SDPA's (dq, dk, dv), None for a sequence with a row that sees no key
    (SDPA's gradients there are NaN) or with no rows."""
    grads = []
    for qs, ks, vs, dos in zip(per_sequence(q, cu_q), per_sequence(k, cu_k),
                               per_sequence(v, cu_k), per_sequence(grad_out, cu_q)):
        if qs.shape[2] == 0 or ks.shape[2] == 0 or (causal and qs.shape[2] > ks.shape[2]):
            grads.append(None)
            continue
        inputs = [t.detach().requires_grad_() for t in (qs, ks, vs)]
        out = sdpa(*inputs, causal="bottom_right" if causal else False)
        grads.append(torch.autograd.grad(out, inputs, dos))
    return grads


def relative_error(got, want) -> float:
    return max_error(got, want) / max(want.abs().max().item(), 1e-30) if want.numel() else 0.0


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths,heads,kv_heads,head_dim,dtype", BACKWARD_CASES)
def test_gradients_match_float64_per_sequence(lengths, heads, kv_heads, head_dim, dtype, causal):
    check_gradients_per_sequence(lengths, heads, kv_heads, head_dim, dtype, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths,heads,kv_heads,head_dim,dtype",
                         [BACKWARD_CASES[i] for i in (0, 3, 5, 6, 7)])
def test_gradients_with_dq_added_atomically_per_sequence(dq_added_atomically, lengths, heads,
                                                         kv_heads, head_dim, dtype, causal):
    """As above, with dQ added by the dK/dV kernel ("dkdv_dq") on every grid."""
    check_gradients_per_sequence(lengths, heads, kv_heads, head_dim, dtype, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("lengths,heads,kv_heads,head_dim,dtype",
                         [BACKWARD_CASES[i] for i in (0, 6)])
def test_deterministic_gradients_per_sequence(launched_kernels, lengths, heads, kv_heads,
                                              head_dim, dtype, causal):
    """As above, under torch.use_deterministic_algorithms: dQ (writing Delta) and dK/dV as
    two kernels, whatever the platform's rule."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        check_gradients_per_sequence(lengths, heads, kv_heads, head_dim, dtype, causal)
    finally:
        torch.use_deterministic_algorithms(False)
    assert launched_kernels[-2:] == ["dq", "dkdv"] and "row_dot" not in launched_kernels


def test_dq_added_atomically_marks_rows_past_a_short_grid_with_nan(dq_added_atomically):
    """A max_seqlen_k below the truth leaves key tiles without a CTA: their share of dQ is
    missing, so every dQ row of those sequences is NaN (as dK and dV past the grid are);
    the sequences whose key tiles the grid covers get their dQ."""
    lengths = [(100, 100), (0, 0), (257, 257), (1, 1), (31, 64)]
    q, k, v, grad_out, cu_q, cu_k = packed_inputs(lengths, 8, 2, 64, "bfloat16", seed=7)

    def grads(max_seqlen):
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        attention_varlen(*inputs, cu_q, cu_k, max_seqlen, max_seqlen,
                         is_causal=True).backward(grad_out)
        return [t.grad for t in inputs]

    small, whole = grads(16), grads(257)
    # max_seqlen 16 makes one key tile per sequence: the sequences whose keys fit one get
    # all of dQ, the others (257 keys) none of it.
    key_tile = dq_added_atomically.launches[64]["dkdv_dq"].tiles.tile_n
    q_lengths, k_lengths = cu_q[1:] - cu_q[:-1], cu_k[1:] - cu_k[:-1]
    covered = (k_lengths <= key_tile).repeat_interleave(q_lengths)
    assert 0 < covered.sum() < covered.numel()
    assert torch.allclose(small[0][covered], whole[0][covered], rtol=1e-2, atol=1e-2)
    assert small[0][~covered].isnan().all() and not whole[0].isnan().any()


def check_gradients_per_sequence(lengths, heads, kv_heads, head_dim, dtype, causal):
    q, k, v, grad_out, cu_q, cu_k = packed_inputs(lengths, heads, kv_heads, head_dim, dtype,
                                                  seed=head_dim * 3 + heads)
    views = [t.transpose(0, 1)[None] for t in (q, k, v, grad_out)]
    bounds = SequenceBounds.packed(cu_q, cu_k)
    max_q, max_k = (max(pair[i] for pair in lengths) for i in (0, 1))
    scale = 1 / math.sqrt(head_dim)
    out, lse = varlen_forward(*views[:3], bounds, max_q, causal=causal, scale=scale,
                              with_lse=True)
    ours = varlen_backward(*views[:3], out, lse, views[3], bounds, max_q, max_k, causal=causal,
                           scale=scale, fill=NAN)
    assert not any(g.isnan().any() for g in ours), "a gradient row never written"
    ours = [per_sequence(g[0].transpose(0, 1), cu) for g, cu in zip(ours, (cu_q, cu_k, cu_k))]
    want = reference_gradients(q, k, v, grad_out, cu_q, cu_k, causal)
    theirs = sdpa_gradients(q, k, v, grad_out, cu_q, cu_k, causal)
    for i, name in enumerate(("dq", "dk", "dv")):
        error = max(relative_error(ours[i][s], want[s][i]) for s in range(len(lengths)))
        bar = max(relative_error(theirs[s][i], want[s][i]) for s in range(len(lengths))
                  if theirs[s] is not None)
        assert error <= 2 * bar + TOLERANCE_EPSILON[q.dtype], \
            f"{name}: relative error {error:.2e}, SDPA's {bar:.2e}"


def test_entry_point_layout_max_seqlen_autograd_and_compile():
    lengths = [(100, 100), (0, 0), (257, 257), (1, 1), (31, 64)]
    q, k, v, grad_out, cu_q, cu_k = packed_inputs(lengths, 8, 2, 128, "bfloat16", seed=3)

    def run(fn, max_seqlen=257):
        inputs = [t.detach().requires_grad_() for t in (q, k, v)]
        out = fn(*inputs, cu_q, cu_k, max_seqlen, max_seqlen, is_causal=True)
        out.backward(grad_out)
        return out, [t.grad for t in inputs]

    out, lse = attention_varlen(q, k, v, cu_q, cu_k, 257, 257, is_causal=True, return_lse=True)
    assert out.shape == q.shape and out.is_contiguous() and lse.shape == (8, q.shape[0])
    eager_out, eager_grads = run(attention_varlen)
    assert torch.equal(eager_out.detach(), out)
    # A max_seqlen below the truth sizes a smaller grid: the forward and the backward mark
    # the rows past it with NaN (output, LSE and gradients) and compute the others.
    small_out, small_grads = run(attention_varlen, max_seqlen=16)
    _, small_lse = attention_varlen(q, k, v, cu_q, cu_k, 16, 16, is_causal=True,
                                    return_lse=True)
    for small, eager, cu in zip([small_out, *small_grads], [eager_out, *eager_grads],
                                (cu_q, cu_q, cu_k, cu_k)):
        lengths = cu[1:] - cu[:-1]
        short = (lengths <= 16).repeat_interleave(lengths)  # rows of sequences the grid covers
        assert torch.equal(small[short], eager[short]) and small[~short].isnan().any()
    q_lengths = cu_q[1:] - cu_q[:-1]
    short = (q_lengths <= 16).repeat_interleave(q_lengths)
    assert torch.equal(small_lse[:, short], lse[:, short]) and small_lse[:, ~short].isnan().any()
    # Causal, the grid's one CTA takes the longest tile, the last: of 257 rows, row 256
    # at any power-of-two tile up to 256 rows.
    long_rows, eager_rows = small_out[cu_q[2]:cu_q[3]], eager_out[cu_q[2]:cu_q[3]]
    assert long_rows[:256].isnan().all() and torch.equal(long_rows[256:], eager_rows[256:])
    long_lse = small_lse[:, cu_q[2]:cu_q[3]]
    assert long_lse[:, :256].isnan().all() and torch.equal(long_lse[:, 256:],
                                                          lse[:, cu_q[2] + 256:cu_q[3]])
    compiled_out, compiled_grads = run(torch.compile(attention_varlen, fullgraph=True))
    assert torch.equal(compiled_out, eager_out)
    assert all(torch.equal(a, b) for a, b in zip(compiled_grads, eager_grads))


def test_backward_reshapes_gradients_by_views_only():
    """Between the packed tensors and the kernels' (1, heads, rows, D) layout the backward
    takes views: a node that copies the gradient (indexing's and as_strided's backwards
    zero-fill a tensor and copy into it) cost 4% of a D=64 backward."""
    q, k, v, _, cu_q, cu_k = packed_inputs([(70, 70), (129, 129)], 4, 2, 64, "float16", seed=5)
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]
    out = attention_varlen(*inputs, cu_q, cu_k, 129, 129, is_causal=True)
    names, pending = set(), [out.grad_fn]
    while pending:
        node = pending.pop()
        names.add(type(node).__name__)
        pending += [parent for parent, _ in node.next_functions if parent is not None]
    assert {"TransposeBackward0", "AccumulateGrad"} <= names
    assert not [n for n in names if n.startswith(("Select", "AsStrided", "CopySlices",
                                                  "Clone", "Index"))], names


def test_planned_calls_on_new_tensors_launch_what_varlen_forward_launches():
    """Without gradients attention_varlen launches the plan its first call of a shape key
    made: later calls, on other tensors (here a strided query, heads 8 of 12 of a wider
    projection), must give what the unplanned launch gives, bit for bit."""
    lengths = [(37, 37), (0, 5), (130, 200)]
    for seed in (1, 2, 3):
        q, k, v, _, cu_q, cu_k = packed_inputs(lengths, 8, 2, 64, "bfloat16", seed=seed)
        wider = torch.randn(q.shape[0], 12, 64, device="cuda", dtype=q.dtype)
        wider[:, 2:10] = q
        query = wider[:, 2:10]
        out, lse = attention_varlen(query, k, v, cu_q, cu_k, 130, 200, is_causal=True,
                                    return_lse=True)
        want, want_lse = varlen_forward(*(t.transpose(0, 1)[None] for t in (query, k, v)),
                                        SequenceBounds.packed(cu_q, cu_k), 130, causal=True,
                                        scale=1 / 8, with_lse=True)
        assert out.shape == q.shape and out.is_contiguous()
        assert torch.equal(out, want[0].transpose(0, 1)) and torch.equal(lse, want_lse[0])
        assert torch.equal(attention_varlen(query, k, v, cu_q, cu_k, 130, 200, is_causal=True),
                           out)


def test_a_call_replays_in_a_cuda_graph_with_new_lengths():
    q, k, v, _, cu_q, cu_k = packed_inputs([(300, 300), (200, 200)], 4, 4, 64, "float16", seed=8)
    attention_varlen(q, k, v, cu_q, cu_k, 300, 300)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = attention_varlen(q, k, v, cu_q, cu_k, 300, 300)
    # New lengths in the same buffers: the graph reads them on the device.
    cu_q.copy_(torch.tensor([0, 123, 500], dtype=torch.int32))
    cu_k.copy_(cu_q)
    q.normal_(), k.normal_(), v.normal_()
    graph.replay()
    torch.testing.assert_close(captured, attention_varlen(q, k, v, cu_q, cu_k, 377, 377),
                               rtol=0, atol=0)


def test_no_queries_and_no_keys():
    q, k, v, _, cu_q, _ = packed_inputs([(0, 0), (0, 0)], 4, 4, 64, "float16", seed=1)
    out, lse = attention_varlen(q, k, v, cu_q, cu_q, 0, 0, return_lse=True)
    assert out.shape == (0, 4, 64) and lse.shape == (4, 0)
    q, k, v, grad_out, cu_q, cu_k = packed_inputs([(5, 0), (9, 0)], 4, 2, 64, "float16", seed=2)
    q.requires_grad_(), k.requires_grad_()
    out, lse = attention_varlen(q, k, v, cu_q, cu_k, 9, 0, return_lse=True)
    assert torch.equal(out, torch.zeros_like(q)) and torch.isneginf(lse).all()
    out.backward(grad_out)
    assert torch.equal(q.grad, torch.zeros_like(q)) and k.grad.shape == k.shape
