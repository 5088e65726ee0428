"""Attention in float64: the answer every kernel is checked against.

It computes what the kernels promise, the plain way: grouped-query heads (query head h
reads K/V head h // group), the causal mask aligned top-left (SDPA's is_causal) or
bottom-right, a row that sees no key giving output 0 and log-sum-exp -inf, and the
per-row log-sum-exp in natural log.
"""

import math

import torch

from .launcher import causal_query_offset


def reference(q, k, v, *, causal=False, scale: float | None = None):
    """(out, lse) in float64 for q (B, H, Lq, D), k and v (B, Hkv, Lk, D), H a multiple of
    Hkv; `causal` as the launcher takes it (False, True, "top_left", "bottom_right")."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q.double() @ k.transpose(-1, -2)) * scale
    q_len, k_len = q.shape[2], k.shape[2]
    query_offset = causal_query_offset(causal, q_len, k_len)
    if query_offset is not None:
        rows = torch.arange(q_len, device=q.device)[:, None]
        keys = torch.arange(k_len, device=q.device)[None, :]
        scores = scores.masked_fill(keys > rows + query_offset, -math.inf)
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # -inf where a row sees no key
    # exp(-inf - 0) = 0: a row that sees no key gets weights 0, so output 0, not NaN.
    weights = torch.exp(scores - lse.nan_to_num(neginf=0.0))
    return weights @ v, lse.squeeze(-1)


def visible_keys(q_len: int, k_len: int, *, offset: int, causal: bool, window=None,
                 device=None) -> torch.Tensor:
    """(q_len, k_len) bool, whether query row i sees key j: offset is row 0's diagonal key,
    which the causal mask and the window (left, right: keys before and after the diagonal,
    None for unbounded; steps/variants.py's Variants.window) are aligned to."""
    rows = torch.arange(q_len, device=device)[:, None] + offset
    keys = torch.arange(k_len, device=device)[None, :]
    seen = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        seen &= keys <= rows
    left, right = window or (None, None)
    if left is not None:
        seen &= keys >= rows - left
    if right is not None and not causal:
        seen &= keys <= rows + right
    return seen


def reference_backward(query, key, value, out, lse, grad_out, *, causal, scale, variants=None,
                       window_offset: int | None = None, delta=None):
    """The backward in closed form, in float64 (autograd does not run inside an op), from
    the given `lse`, which may hold more keys than these (a shard of a ring's, or a
    sink's): P = exp(scores - lse) (causal as `reference` takes it),
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K s, dK = dS^T Q s, summed
    over the query heads of each K/V head. `variants`: the softcap (scores
    c tanh(S / c), whose derivative 1 - tanh^2 multiplies dS) and the window, aligned to
    the causal diagonal or, without one, to `window_offset` (default 0). `delta`:
    rowsum(dO * O) where the caller has it."""
    group = query.shape[1] // key.shape[1]
    q, k, v, o, do = (t.double() for t in (query, key, value, out, grad_out))
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    scores = (q @ k.transpose(-1, -2)) * scale
    softcap = variants.softcap if variants is not None else None
    if softcap is not None:
        capped = torch.tanh(scores / softcap)
        scores = softcap * capped
    p = torch.exp(scores - lse.double()[..., None])
    offset = causal_query_offset(causal, q.shape[2], k.shape[2])
    seen = visible_keys(q.shape[2], k.shape[2], causal=offset is not None,
                        offset=offset if offset is not None else window_offset or 0,
                        window=variants.window if variants is not None else None,
                        device=q.device)
    p = p.masked_fill(~seen, 0.0)
    delta = (do * o).sum(-1) if delta is None else delta.double()
    ds = p * (do @ v.transpose(-1, -2) - delta[..., None])
    if softcap is not None:
        ds = ds * (1 - capped ** 2)
    dq, dk, dv = (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.transpose(-1, -2) @ do
    dk, dv = (t.unflatten(1, (-1, group)).sum(2) for t in (dk, dv))
    return tuple(t.to(query.dtype) for t in (dq, dk, dv))


def reference_errors(out, q, k, v, *, causal=False, scale: float | None = None, lse=None,
                     max_scores: int = 1 << 28) -> tuple[float, float | None]:
    """Largest |out - reference| and, when `lse` is given, largest |lse - reference lse|
    (0 where both are -inf), a few heads at a time so the float64 score matrices stay
    under `max_scores` elements. NaN anywhere in `out` or `lse` gives NaN."""
    batch, heads, q_len, _ = q.shape
    group = heads // k.shape[1]
    heads_per_chunk = max(1, max_scores // (q_len * k.shape[2]))
    worst_out, worst_lse = 0.0, 0.0
    for b in range(batch):
        for start in range(0, heads, heads_per_chunk):
            query_heads = slice(start, min(start + heads_per_chunk, heads))
            kv_heads = torch.arange(query_heads.start, query_heads.stop, device=q.device) // group
            # Each query head of the chunk with a copy of the K/V head it reads.
            want_out, want_lse = reference(q[b:b + 1, query_heads], k[b:b + 1, kv_heads],
                                           v[b:b + 1, kv_heads], causal=causal, scale=scale)
            worst_out = _max_error(worst_out, out[b:b + 1, query_heads], want_out)
            if lse is not None:
                worst_lse = _max_error(worst_lse, lse[b:b + 1, query_heads], want_lse)
    return worst_out, (worst_lse if lse is not None else None)


def _max_error(worst: float, got, want) -> float:
    error = (got.double() - want).abs()
    error = error.masked_fill(torch.isneginf(got) & torch.isneginf(want), 0.0)
    largest = error.max().item()
    return math.nan if math.isnan(worst) or math.isnan(largest) else max(worst, largest)


def reference_gradients(q, k, v, grad_out, *, causal=False, scale: float | None = None):
    """(dq, dk, dv) in float64 of `reference`'s output for the incoming gradient
    `grad_out`, by autograd (grouped-query gradients summed over each K/V head's query
    heads through repeat_interleave). Every row must see a key: a row that sees none has
    no gradient of its log-sum-exp (NaN)."""
    inputs = [t.detach().double().requires_grad_() for t in (q, k, v)]
    out, _ = reference(*inputs, causal=causal, scale=scale)
    return torch.autograd.grad(out, inputs, grad_out.double())
