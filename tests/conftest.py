"""Shared fixtures."""

import fcntl
import math
from collections import Counter

import pytest
import torch

from cutile_fmha.steps.launcher import causal_query_offset
from cutile_fmha.steps.reference import reference, reference_backward, visible_keys


def reference_forward_launch(query, key, value, causal: str, scale: float, with_lse: bool):
    """Stands in for the dense forward's launch on the CPU: the float64 reference, in the
    inputs' dtype, with its LSE."""
    from cutile_fmha.dropin import _launcher_causal

    out, lse = reference(query, key, value, causal=_launcher_causal(causal), scale=scale)
    return out.to(query.dtype), (lse.float() if with_lse else None)


def reference_with_variants(query, key, value, *, offset: int, causal: bool, scale: float,
                            variants, sinks=None):
    """(out in the inputs' dtype, lse float32) of attention with the variants
    (steps/variants.py's Variants) in float64; offset: row 0's diagonal key, which the
    causal mask and the window are aligned to."""
    group = query.shape[1] // key.shape[1]
    q = query.double()
    k, v = (t.double().repeat_interleave(group, 1) for t in (key, value))
    scores = q @ k.transpose(-1, -2) * scale
    if variants.softcap is not None:
        scores = variants.softcap * torch.tanh(scores / variants.softcap)
    seen = visible_keys(q.shape[2], k.shape[2], offset=offset, causal=causal,
                        window=variants.window)
    scores = scores.masked_fill(~seen, -math.inf)
    if sinks is not None:
        scores = torch.cat([scores, sinks.double()[None, :, None, None].expand(
            *scores.shape[:-1], 1)], -1)
    lse = torch.logsumexp(scores, -1)
    weights = torch.exp(scores - lse[..., None]).nan_to_num(0.0)[..., :k.shape[2]]
    return (weights @ v).to(query.dtype), lse.float()


def reference_variants_launch(query, key, value, sinks, causal: str, scale: float,
                              with_lse: bool, variants):
    """Stands in for the dense variants' launch (cutile_fmha.dropin.variants_launch)."""
    from cutile_fmha.dropin import _launcher_causal

    offset = causal_query_offset(_launcher_causal(causal), query.shape[2], key.shape[2])
    out, lse = reference_with_variants(query, key, value, offset=offset or 0,
                                       causal=offset is not None, scale=scale,
                                       variants=variants, sinks=sinks)
    return out, (lse if with_lse else None)


def reference_kvcache(query, key_cache, value_cache, cache_seqlens=None, *, cache_leftpad=None,
                      is_causal=True, scale=None, window_size=(-1, -1), softcap=None, sinks=None,
                      **_):
    """attention_with_kvcache on a dense cache in float64, sequence by sequence, with the
    variants aligned to each sequence's last key."""
    from cutile_fmha.steps.variants import Variants

    scale = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    window = None if tuple(window_size) == (-1, -1) else \
        tuple(None if side == -1 else side for side in window_size)
    variants = Variants(window=window, softcap=softcap, sinks=sinks is not None)
    return reference_dense_cache(query, key_cache, value_cache, cache_leftpad, cache_seqlens,
                                 causal=is_causal, scale=scale, variants=variants,
                                 sinks=sinks)[0]


def reference_decode_forward(q, key_cache, value_cache, shape, *, scale, key_starts=None,
                             key_ends=None, block_table=None, sinks=None, **_):
    """steps.decode.decode_forward in float64: a paged cache gathered into a dense one
    (block numbers clamped to its blocks, as the kernel clamps them), then
    reference_dense_cache."""
    if block_table is not None:  # (batch, kv_heads, blocks x block size, D), gathered
        blocks = block_table.long().clamp(0, key_cache.shape[0] - 1)
        key_cache, value_cache = (c[blocks].flatten(1, 2).transpose(1, 2)
                                  for c in (key_cache, value_cache))
    out, lse = reference_dense_cache(q, key_cache, value_cache, key_starts, key_ends,
                                     causal=shape.causal, scale=scale, variants=shape.asked,
                                     sinks=sinks)
    return out, lse if shape.write_lse else None


def reference_dense_cache(q, key_cache, value_cache, starts, ends, *, causal, scale, variants,
                          sinks):
    """(out, lse) of q against a dense cache in float64, sequence by sequence: its keys from
    `starts` (int32 (batch,) or None: 0) to `ends` (None: the cache's length), clamped to
    the cache, the causal mask and the variants aligned to each sequence's last key."""
    batch, _, q_len, _ = q.shape
    capacity = key_cache.shape[2]
    ends = [capacity] * batch if ends is None else ends.clamp(0, capacity).tolist()
    starts = [0] * batch if starts is None else starts.clamp(0, capacity).tolist()
    out = q.new_zeros(q.shape[:-1] + value_cache.shape[-1:])
    lse = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    for b, (start, end) in enumerate(zip(starts, ends)):
        if end > start or sinks is not None:
            keys = slice(start, max(start, end))
            out[b:b + 1], lse[b:b + 1] = reference_with_variants(
                q[b:b + 1], key_cache[b:b + 1, :, keys], value_cache[b:b + 1, :, keys],
                offset=max(end - start, 0) - q_len, causal=causal, scale=scale,
                variants=variants, sinks=sinks)
    return out, lse


def _bound_lists(bounds):
    """(query starts, query ends, key starts, key ends) of SequenceBounds, as lists."""
    if bounds.cumulative:
        cu_q, cu_k = bounds.query_starts.tolist(), bounds.key_starts.tolist()
        return cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]
    return [t.tolist() for t in bounds.tensors()]


def _sequences(q, k, bounds):
    """Per sequence: (q batch row, query rows, k batch row, key rows), read on the host."""
    for s, (qs, qe, ks, ke) in enumerate(zip(*_bound_lists(bounds))):
        yield min(s, q.shape[0] - 1), slice(qs, qe), min(s, k.shape[0] - 1), slice(ks, ke)


def _alignment(causal: bool):
    return "bottom_right" if causal else False


def reference_varlen_forward(q, k, v, bounds, max_seqlen_q, *, causal, scale, with_lse,
                             fill=None, variants=None, sinks=None):
    """steps.varlen.varlen_forward in float64, sequence by sequence (each causal mask and
    window aligned to the sequence's last key)."""
    out = q.new_full(q.shape[:-1] + v.shape[-1:], 0.0 if fill is None else fill)
    lse = torch.full(q.shape[:-1], 0.0 if fill is None else fill, dtype=torch.float32)
    for qb, rows, kb, keys in _sequences(q, k, bounds):
        if rows.stop <= rows.start:
            continue
        one = (q[qb:qb + 1, :, rows], k[kb:kb + 1, :, keys], v[kb:kb + 1, :, keys])
        if variants is not None and variants.any:
            o, l = reference_with_variants(*one, offset=(keys.stop - keys.start)
                                           - (rows.stop - rows.start), causal=causal,
                                           scale=scale, variants=variants, sinks=sinks)
        elif keys.stop <= keys.start:
            out[qb, :, rows], lse[qb, :, rows] = 0.0, -math.inf
            continue
        else:
            o, l = reference(*one, causal=_alignment(causal), scale=scale)
        out[qb, :, rows], lse[qb, :, rows] = o[0].to(q.dtype), l[0].float()
    return out, (lse if with_lse else None)


class ReferenceVarlenPlan:
    """Stands in for steps.varlen.forward_plan's plan: its launch on the packed (tokens,
    heads, D) tensors themselves, through reference_varlen_forward."""

    def __init__(self, q, k, v, bounds, max_seqlen_q, *, causal, scale, with_lse,
                 variants=None):
        self.max_seqlen_q, self.causal, self.scale = max_seqlen_q, causal, scale
        self.with_lse, self.variants = with_lse, variants

    def launch(self, query, key, value, out, lse, bounds, sinks):
        from cutile_fmha.steps.varlen import SequenceBounds

        query_starts, _, key_starts, _ = bounds
        rows = [t.transpose(0, 1)[None] for t in (query, key, value)]
        o, l = reference_varlen_forward(*rows, SequenceBounds.packed(query_starts, key_starts),
                                        self.max_seqlen_q, causal=self.causal,
                                        scale=self.scale, with_lse=True,
                                        variants=self.variants, sinks=sinks)
        out.copy_(o[0].transpose(0, 1))
        if self.with_lse:
            lse.copy_(l[0])


def reference_varlen_backward(q, k, v, out, lse, grad_out, bounds, max_seqlen_q, max_seqlen_k,
                              *, causal, scale, fill=None, variants=None, delta=None):
    """steps.varlen.varlen_backward in float64, sequence by sequence (each window aligned
    to the sequence's last key)."""
    grads = [torch.full_like(t, 0.0 if fill is None else fill) for t in (q, k, v)]
    for t in grads[1:]:  # keys no query sees get 0 (written by the kernels too)
        for _, _, kb, keys in _sequences(q, k, bounds):
            t[kb, :, keys] = 0.0
    for qb, rows, kb, keys in _sequences(q, k, bounds):
        if rows.stop <= rows.start or keys.stop <= keys.start:
            grads[0][qb, :, rows] = 0.0
            continue
        per_sequence = reference_backward(
            q[qb:qb + 1, :, rows], k[kb:kb + 1, :, keys], v[kb:kb + 1, :, keys],
            out[qb:qb + 1, :, rows], lse[qb:qb + 1, :, rows], grad_out[qb:qb + 1, :, rows],
            causal=_alignment(causal), scale=scale, variants=variants,
            window_offset=(keys.stop - keys.start) - (rows.stop - rows.start),
            delta=None if delta is None else delta[qb:qb + 1, :, rows])
        for grad, part, batch, where in zip(grads, per_sequence, (qb, kb, kb), (rows, keys, keys)):
            grad[batch, :, where] += part[0]
    return tuple(grads)


@pytest.fixture
def kernels_on_the_cpu(monkeypatch):
    """cutile_fmha.attention's wiring (custom ops, autograd, torch.compile, the
    transformers backend) and attention_varlen's (its planned launch too) with the kernels
    replaced by the reference, so it runs on the CPU; the kernels themselves are checked on the GPU
    (test_gpu_*.py). Gives the calls made, by kind."""
    import cutile_fmha.dropin as dropin
    import cutile_fmha.varlen as varlen

    for module in (dropin, varlen):
        monkeypatch.setattr(module, "row_dot", reference_row_dot)
    monkeypatch.setattr(varlen, "forward_plan", ReferenceVarlenPlan)
    return count_kernel_calls(monkeypatch, forward=reference_forward_launch,
                              variants=reference_variants_launch,
                              backward=reference_backward,
                              varlen_forward=reference_varlen_forward,
                              varlen_backward=reference_varlen_backward,
                              decode=reference_kvcache)


def reference_row_dot(out, grad_out):
    """Stands in for the backward's row_dot kernel: rowsum(out * grad_out), float32."""
    return (out.double() * grad_out.double()).sum(-1).float()


@pytest.fixture
def launched_kernels(monkeypatch) -> list:
    """The names of the cuTile kernels launched during the test, in order (each still
    launched)."""
    import cuda.tile as ct

    launched, launch = [], ct.launch

    def recorded(stream, grid, kernel, arguments, **options):
        launched.append(kernel._pyfunc.__name__)
        return launch(stream, grid, kernel, arguments, **options)

    monkeypatch.setattr(ct, "launch", recorded)
    return launched


@pytest.fixture
def decode_on_the_cpu(monkeypatch):
    """attention_with_kvcache's wiring (checks, shapes, the custom operator under
    torch.compile) with the decode launches replaced by reference_decode_forward, on the
    CPU."""
    import cutile_fmha.kvcache as kvcache

    monkeypatch.setattr(kvcache, "decode_forward", reference_decode_forward)
    monkeypatch.setattr(kvcache, "_check_devices", lambda named: None)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The calls cutile_fmha.attention and attention_varlen make to the real kernels, by
    kind."""
    return count_kernel_calls(monkeypatch)


def count_kernel_calls(monkeypatch, **stand_ins) -> Counter:
    """Counts the kernel launches the public entry points make, by kind: "forward" (dense
    forward launches), "variants" (the dense variants' launches), "backward", "varlen_forward", "varlen_backward", "decode" (the
    transformers backend's decoding steps; so a test sees that its model really ran them),
    each optionally through a stand-in."""
    import cutile_fmha.dropin as dropin
    import cutile_fmha.kvcache as kvcache
    import cutile_fmha.varlen as varlen

    calls = Counter()
    for kind, module, name in (("forward", dropin, "forward_launch"),
                               ("variants", dropin, "variants_launch"),
                               ("backward", dropin, "attention_backward"),
                               ("varlen_forward", varlen, "varlen_forward"),
                               ("varlen_backward", varlen, "varlen_backward"),
                               ("decode", kvcache, "attention_with_kvcache")):
        fn = stand_ins.get(kind) or getattr(module, name)
        monkeypatch.setattr(module, name, _counted(calls, kind, fn))
    return calls


def _counted(calls: Counter, name: str, fn):
    def wrapper(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)
    return wrapper


def _sm_90_backward_with_dkdv_dq(monkeypatch, **changes):
    """sm_90's backward entry, each head dim's "dkdv_dq" launch (on dK/dV's tiles where a
    head dim has none) with `changes`, as the launcher's for any GPU."""
    import dataclasses

    from cutile_fmha.platforms.backward import backward_entry_for
    from cutile_fmha.steps import backward as launcher

    entry = backward_entry_for("sm_90")
    entry = dataclasses.replace(entry, launches={
        head_dim: kernels | {"dkdv_dq": dataclasses.replace(
            kernels.get("dkdv_dq", kernels["dkdv"]), **changes)}
        for head_dim, kernels in entry.launches.items()})
    monkeypatch.setattr(launcher, "backward_entry_for", lambda arch: entry)
    return entry


@pytest.fixture
def dq_added_atomically(monkeypatch):
    """The backward with dQ added by the dK/dV kernel (ATOMIC_DQ) for every call at every
    head dim: the platform's "dkdv_dq" launches without their ``only_with`` (sm_90's at
    D=128 runs only with a softcap, a window, split columns, without the causal mask, for
    a packed batch or with at most four query heads to a K/V head), and one on dK/dV's
    tiles where a head dim has none."""
    return _sm_90_backward_with_dkdv_dq(monkeypatch, only_with=None)


@pytest.fixture
def dq_added_late(monkeypatch):
    """As ``dq_added_atomically``, with each pair's dQ added one turn late at every head dim
    (DQ_LATE: sm_90's table has it at D=128 only)."""
    return _sm_90_backward_with_dkdv_dq(monkeypatch, only_with=None, dq_late=True)


@pytest.fixture
def queries_in_chunks(monkeypatch):
    """The one-kernel backward without the causal mask in chunks of 128 query rows from 512
    rows per K/V head at every head dim whose columns it pads (``query_chunk_rows``;
    sm_90's: 16384 from 65536 at D=128's launch only), so that small problems run it."""
    return _sm_90_backward_with_dkdv_dq(monkeypatch, chunk_query_rows=128)


@pytest.fixture
def large_gpu_memory(tmp_path_factory):
    """For a test that takes tens of GB of GPU memory: one such test at a time across
    pytest-xdist's workers (a lock file in their shared temporary directory), its cached
    memory handed back after it."""
    lock = tmp_path_factory.getbasetemp().parent / "large-gpu-memory.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        yield
        torch.cuda.empty_cache()
