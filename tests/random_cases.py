"""Random cases of the three entry points against float64, forward and backward: the
draws and the check (tests/test_gpu_random_cases.py runs them on the GPU,
tests/test_random_cases_on_the_cpu.py the dense ones over the float64 stand-in kernels).

The other GPU tests pick their cases by hand; these draw them: dtype, head dims (D_v
other than D too), grouped heads, lengths from 0 to past a few tiles (tile edges
favoured), both causal alignments, windows, softcap, sinks, scale, (batch, seq, heads, D)
views, packed batches with empty sequences, dense and paged caches with left padding,
shuffled blocks and forced splits; some calls through torch.compile, some replayed from a
CUDA graph. Every case is a seed: a failure names the case and
`CUTILE_FMHA_RANDOM_SEED` / `CUTILE_FMHA_RANDOM_CASES` replay or widen the draw (16 cases
per entry point by default); `CUTILE_FMHA_RANDOM_LOG=file` appends each case's errors and
bounds to the file.

The bound on each error is measured, not fixed: the same attention in float32 from the
same half-precision inputs, with the unnormalised weights rounded to the inputs' dtype
before they meet V (as every kernel here does), gives the error half precision costs;
ours may be 2x that plus an ulp of the largest entry (gradients, whose kernels round
more than that emulation does: 4x plus three ulps). A key seen that should not be, or a
row or head mixed up, gives errors of the order of the entries themselves.
"""

import math
import os
import random
from dataclasses import dataclass, field

import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from cutile_fmha import attention, attention_varlen, attention_with_kvcache, attention_with_lse
from cutile_fmha.steps.reference import visible_keys

HEAD_DIMS = (64, 128, 256, 64, 128, 40, 80, 96, 112, 192, 24, 248)  # 64 and 128 drawn most
DEVICE = "cuda"
FLOOR = 0.03  # the least "largest entry" a bound scales: exact zeros get rounding noise too
ULPS = {torch.float16: 2 ** -10, torch.bfloat16: 2 ** -7}  # of the largest |entry|


@dataclass
class Sequence:
    """One sequence's attention: q (heads, q_len, D), k (kv_heads, k_len, D), v
    (kv_heads, k_len, D_v) and which keys each row sees, (q_len, k_len) bool."""
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seen: torch.Tensor


@dataclass
class Case:
    """What an entry point returned, and what to check it against."""
    sequences: list
    out: list  # per sequence, (heads, q_len, D_v)
    lse: list | None
    scale: float
    softcap: float | None
    sinks: torch.Tensor | None
    grads: dict = field(default_factory=dict)  # name: ours, per sequence ([one] for sinks)
    grad_outs: list = field(default_factory=list)  # per sequence, the gradient of out


def attend(sequences, scale, softcap, sinks, dtype=None):
    """Per sequence (out, lse): in the sequences' own dtype (float64 for the reference),
    or, with `dtype`, in float32 with the weights rounded to it before they meet V."""
    results = []
    for s in sequences:
        group = s.q.shape[0] // s.k.shape[0]
        k, v = (t.repeat_interleave(group, 0) for t in (s.k, s.v))
        scores = s.q @ k.transpose(-1, -2) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        seen = s.seen.expand(scores.shape)
        if sinks is not None:
            sink = sinks.to(scores.dtype)[:, None, None].expand(*scores.shape[:-1], 1)
            scores = torch.cat([scores, sink], -1)
            seen = torch.cat([seen, seen.new_ones(seen.shape[:-1] + (1,))], -1)
        anything = seen.any(-1, keepdim=True)
        # rows that see nothing: finite scores, so no NaN in their (zero) gradients
        scores = torch.where(anything, scores.masked_fill(~seen, -math.inf), 0.0)
        top = scores.amax(-1, keepdim=True).detach() if scores.shape[-1] else \
            scores.new_zeros(scores.shape[:-1] + (1,))
        weights = torch.exp(scores - top) * anything
        total = weights.sum(-1, keepdim=True)
        if dtype is not None:  # rounded as the kernels round P, the gradient passed through
            weights = weights + (weights.to(dtype).to(weights.dtype) - weights).detach()
        out = weights[..., :s.k.shape[1]] @ v / total.masked_fill(total == 0, 1.0)
        lse = torch.where(anything, (top + total.log()), -math.inf).squeeze(-1)
        results.append((out, lse))
    return results


def copies(sequences, dtype, grad: bool):
    """The sequences in `dtype`, leaves where grad flows (one per q, k, v of each)."""
    made = []
    for s in sequences:
        q, k, v = (t.detach().to(dtype).requires_grad_(grad) for t in (s.q, s.k, s.v))
        made.append(Sequence(q, k, v, s.seen))
    return made


def largest(tensors) -> float:
    return max([t.abs().max().item() for t in tensors if t.numel()] + [1e-30])


def leaf_grads(sequences, sinks) -> dict:
    """The gradients autograd left on the copies, named as Case.grads names them."""
    def grad(t):  # a leaf no sequence used (none in the batch) has none
        return torch.zeros_like(t) if t.grad is None else t.grad

    grads = {name: [grad(getattr(s, name)) for s in sequences] for name in "qkv"}
    if sinks is not None:
        grads["sinks"] = [grad(sinks)]
    return grads


def max_error(ours, expected, dtype=None) -> float:
    """The largest |ours - expected| over the sequences (ours rounded to `dtype` first);
    NaN anywhere gives NaN, which no bound passes."""
    errors = [((a.to(dtype) if dtype else a).double() - b).abs().max().item()
              for a, b in zip(ours, expected) if b.numel()]
    return math.nan if any(map(math.isnan, errors)) else max(errors + [0.0])


def sinks_gradient_of_rounded_output(emulated, grad_outs, sinks, dtype) -> torch.Tensor:
    """dsinks as the kernels form it, -sum_i exp(sink - lse_i) * rowsum(dO_i * O_i), from
    the float32 emulation's LSE and output, the output rounded to `dtype` first as the
    kernels' is (autograd through the emulation takes Delta from the unrounded one)."""
    total = torch.zeros_like(sinks)
    for (o, lse), g in zip(emulated, grad_outs):
        delta = (g.float() * o.detach().to(dtype).float()).sum(-1)
        total = total - (torch.exp(sinks.detach()[:, None] - lse.detach()) * delta).sum(-1)
    return total


def check(case: Case, dtype, name: str):
    """Asserts ours within the measured bound of float64, forward and backward."""
    grad = bool(case.grads)
    exact = copies(case.sequences, torch.float64, grad)
    rounded = copies(case.sequences, torch.float32, grad)
    sinks64 = sinks32 = None
    if case.sinks is not None:
        sinks64 = case.sinks.detach().double().requires_grad_(grad)
        sinks32 = case.sinks.detach().float().requires_grad_(grad)
    expected = attend(exact, case.scale, case.softcap, sinks64)
    emulated = attend(rounded, case.scale, case.softcap, sinks32, dtype)
    assert not any(o.isnan().any() for o in case.out), f"{name}: NaN in out"
    outs = [o for o, _ in expected]
    bar = max_error([o for o, _ in emulated], outs, dtype)
    errors = {"out": (max_error(case.out, outs), bar,
                      2 * bar + ULPS[dtype] * (largest(outs) + FLOOR))}
    for o, (e, _) in zip(case.out, expected):
        assert o.shape == e.shape, f"{name}: out of shape {tuple(o.shape)}"
    for lse, (_, e) in zip(case.lse or [], expected):
        none = torch.isneginf(e)
        differ = torch.isneginf(lse) != none
        assert not differ.any(), (f"{name}: {differ.sum().item()} rows of {differ.numel()} "
                                  f"differ in whether they see a key: ours "
                                  f"{lse[differ][:4].tolist()}, float64 {e[differ][:4].tolist()}")
        gap = (lse.double() - e)[~none].abs()
        assert (gap <= 2e-3 + 1e-4 * e[~none].abs()).all(), \
            f"{name}: lse off by {gap.max().item():.3e}"
    if grad:
        torch.autograd.backward(outs, [g.double() for g in case.grad_outs])
        torch.autograd.backward([o for o, _ in emulated], [g.float() for g in case.grad_outs])
        exact_grads, rounded_grads = leaf_grads(exact, sinks64), leaf_grads(rounded, sinks32)
        if sinks32 is not None:  # whichever float32 form of dsinks is further from float64
            closed_form = sinks_gradient_of_rounded_output(emulated, case.grad_outs, sinks32,
                                                           dtype)
            if max_error([closed_form], exact_grads["sinks"]) > \
                    max_error(rounded_grads["sinks"], exact_grads["sinks"]):
                rounded_grads["sinks"] = [closed_form]
        for label, ours in case.grads.items():
            assert not any(g.isnan().any() for g in ours), f"{name}: NaN in d{label}"
            bar = max_error(rounded_grads[label], exact_grads[label], dtype)
            errors["d" + label] = (max_error(ours, exact_grads[label]), bar,
                                   4 * bar + 3 * ULPS[dtype] * (largest(exact_grads[label])
                                                                + FLOOR))
    log = os.environ.get("CUTILE_FMHA_RANDOM_LOG")
    if log:  # how close each case came to its bounds, to read the bounds' margin from
        with open(log, "a") as f:
            f.write(f"{name}\t{dtype}\t" + "\t".join(
                f"{k} {e:.3e} {b:.3e} {e / bound:.3f}" for k, (e, b, bound) in errors.items())
                + "\n")
    failed = {k: v for k, v in errors.items() if not v[0] <= v[2]}  # NaN fails
    assert not failed, f"{name}: (error, half-precision bar, bound) {failed}"


def our_gradients(case: Case, out, leaves: dict, per_sequence) -> None:
    """Backpropagates a random gradient of out through ours, into case.grads (per
    sequence, via per_sequence(name, tensor)) and case.grad_outs."""
    grad_out = torch.randn_like(out)
    names = [n for n, t in leaves.items() if t is not None]
    found = torch.autograd.grad(out, [leaves[n] for n in names], grad_out, allow_unused=True)
    for n, g in zip(names, found):
        g = torch.zeros_like(leaves[n]) if g is None else g
        case.grads[n] = [g] if n == "sinks" else per_sequence(n, g)
    case.grad_outs = per_sequence("out", grad_out)


def length(rng: random.Random, low: int = 0) -> int:
    kind = rng.random()
    if kind < 0.3:
        return rng.randint(max(low, 0), 17)
    if kind < 0.6:
        return max(low, rng.choice([63, 64, 65, 127, 128, 129, 191, 255, 256, 257]))
    return rng.randint(max(low, 100), 1100)


def variants(rng: random.Random, causal: bool, heads: int):
    """(window_size, softcap, sinks) drawn: each present in about a third of the cases."""
    window = (-1, -1)
    if rng.random() < 0.35:
        left = rng.choice([-1, 0, 1, rng.randint(2, 300)])
        right = rng.choice([-1, 0]) if causal else rng.choice([-1, 0, 1, rng.randint(2, 300)])
        window = (left, right)
    softcap = rng.uniform(1.0, 50.0) if rng.random() < 0.3 else None
    sinks = torch.randn(heads, device=DEVICE) * 2 if rng.random() < 0.3 else None
    return window, softcap, sinks


def heads_and_dims(rng: random.Random):
    dtype = rng.choice([torch.float16, torch.bfloat16])
    d = rng.choice(HEAD_DIMS)
    dv = d if rng.random() < 0.75 else rng.choice(HEAD_DIMS)
    kv_heads = rng.choice([1, 2, 3])
    return dtype, d, dv, kv_heads, kv_heads * rng.choice([1, 1, 2, 3, 4])


def window_seen(q_len, k_len, diagonal: int, causal: bool, window):
    """(q_len, k_len) bool, the keys each row sees (row i's diagonal key is diagonal + i),
    for flash-attn's window_size (-1: unbounded)."""
    return visible_keys(q_len, k_len, offset=diagonal, causal=causal, device=DEVICE,
                        window=tuple(None if side == -1 else side for side in window))


def called(rng: random.Random, call, grad: bool):
    """call()'s (out, lse or None): a quarter of the time through torch.compile (its
    "aot_eager" backend: the custom operators' shape functions and autograd under
    dynamo, without inductor's compile time); else, where no gradient flows, a third of
    the time also captured in a CUDA graph and replayed, which must give the same bits
    (no call may wait on the host, so every one can be captured)."""
    if rng.random() < 0.25:
        torch._dynamo.reset()  # each case its own graph, never the recompile limit's eager
        return torch.compile(call, backend="aot_eager")()
    result = call()
    if grad or rng.random() >= 1 / 3 or DEVICE != "cuda":
        return result
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # what runs once per shape (plans, compiles) runs here
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    graph.replay()
    for eager, replayed in zip(result, captured):
        assert eager is None or torch.equal(eager, replayed), "a CUDA graph's replay differs"
    return result


def draw_dense(rng: random.Random) -> tuple[Case, torch.dtype]:
    dtype, d, dv, kv_heads, heads = heads_and_dims(rng)
    batch, q_len, k_len = rng.choice([0, 1, 2, 3, 3]), length(rng), length(rng)
    causal = rng.choice(["none", "top_left", "bottom_right"])
    window, softcap, sinks = variants(rng, causal != "none", heads)
    grad = rng.random() < 0.5
    if DEVICE == "cuda" and rng.random() < 0.1:  # steps 10-11's: forward only, no variant
        d = dv = rng.choice([320, 384, 512])
        window, softcap, sinks, grad = (-1, -1), None, None, False
    scale = rng.choice([None, rng.uniform(0.02, 0.3)])
    # SDPA's layout, (batch, seq, heads, D) tensors viewed as it, or one projection's
    # (batch, seq, 3, heads, D) output viewed as q, k and v
    layout = rng.choice(["heads", "heads", "seq", "qkv"])
    if layout == "qkv" and (kv_heads, k_len, dv) != (heads, q_len, d):
        layout = "seq"
    magnitude = rng.uniform(0.5, 3.0)

    def make(h, n, width, magnitude=1.0):
        shape = (batch, n, h, width) if layout == "seq" else (batch, h, n, width)
        t = (torch.randn(shape, device=DEVICE) * magnitude).to(dtype)
        return (t.transpose(1, 2) if layout == "seq" else t).requires_grad_(grad)

    if layout == "qkv":
        qkv = torch.randn(batch, q_len, 3, heads, d, device=DEVICE)
        qkv[:, :, 0] *= magnitude
        qkv = qkv.to(dtype).requires_grad_(grad)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
    else:
        q = make(heads, q_len, d, magnitude)
        k, v = make(kv_heads, k_len, d), make(kv_heads, k_len, dv)
    if sinks is not None:
        sinks.requires_grad_(grad)
    mask = {"bottom_right": causal_lower_right(q_len, k_len),
            "top_left": rng.choice([None, causal_upper_left(q_len, k_len)])}.get(causal)
    options = dict(attn_mask=mask, is_causal=causal == "top_left" and mask is None,
                   scale=scale, enable_gqa=True, window_size=window, softcap=softcap,
                   sinks=sinks)
    with_lse = rng.random() < 0.6
    out, lse = called(rng, lambda: attention_with_lse(q, k, v, **options) if with_lse else
                      (attention(q, k, v, **options), None), grad)
    assert out.shape == (batch, heads, q_len, dv), out.shape
    assert lse is None or lse.shape == (batch, heads, q_len), lse.shape
    diagonal = k_len - q_len if causal == "bottom_right" else 0
    seen = window_seen(q_len, k_len, diagonal, causal != "none", window)
    sequences = [Sequence(q[b].detach(), k[b].detach(), v[b].detach(), seen)
                 for b in range(batch)]
    case = Case(sequences, list(out.detach()), lse if lse is None else list(lse),
                scale or d ** -0.5, softcap, sinks)
    if grad:
        our_gradients(case, out, dict(q=q, k=k, v=v, sinks=sinks), lambda _, g: list(g))
    return case, dtype


def draw_varlen(rng: random.Random) -> tuple[Case, torch.dtype]:
    dtype, d, dv, kv_heads, heads = heads_and_dims(rng)
    batch = rng.randint(1, 5)
    q_lens = [length(rng) for _ in range(batch)]
    k_lens = q_lens if rng.random() < 0.5 else [length(rng) for _ in range(batch)]
    causal = rng.random() < 0.6
    window, softcap, sinks = variants(rng, causal, heads)
    scale = rng.choice([None, rng.uniform(0.02, 0.3)])
    grad = rng.random() < 0.5 and sum(q_lens) > 0 and sum(k_lens) > 0
    magnitude = rng.uniform(0.5, 3.0)
    if (kv_heads, k_lens, dv) == (heads, q_lens, d) and rng.random() < 0.4:
        # one projection's (tokens, 3, heads, D) output viewed as q, k and v
        qkv = torch.randn(sum(q_lens), 3, heads, d, device=DEVICE)
        qkv[:, 0] *= magnitude
        qkv = qkv.to(dtype).requires_grad_(grad)
        q, k, v = qkv.unbind(1)
    else:  # one more head allocated than used, sometimes: a stride past the heads' extent
        spare = rng.choice([0, 0, 1])
        q, k, v = ((torch.randn(n, h + spare, w, device=DEVICE) * m).to(dtype)[:, :h]
                   .requires_grad_(grad)
                   for n, h, w, m in ((sum(q_lens), heads, d, magnitude),
                                      (sum(k_lens), kv_heads, d, 1.0),
                                      (sum(k_lens), kv_heads, dv, 1.0)))
    if sinks is not None:
        sinks.requires_grad_(grad)
    cu_q, cu_k = ([0] + list(torch.tensor(lens).cumsum(0).tolist()) for lens in (q_lens, k_lens))
    with_lse = rng.random() < 0.6
    bounds = [torch.tensor(cu, dtype=torch.int32, device=DEVICE) for cu in (cu_q, cu_k)]

    def call():
        result = attention_varlen(q, k, v, *bounds, max(q_lens), max(k_lens),
                                  is_causal=causal, scale=scale, return_lse=with_lse,
                                  window_size=window, softcap=softcap, sinks=sinks)
        return result if with_lse else (result, None)

    out, lse = called(rng, call, grad)
    assert out.shape == (sum(q_lens), heads, dv), out.shape
    assert lse is None or lse.shape == (heads, sum(q_lens)), lse.shape
    sequences, outs, lses = [], [], []
    for b in range(batch):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        seen = window_seen(q_lens[b], k_lens[b], k_lens[b] - q_lens[b], causal, window)
        sequences.append(Sequence(*(t[r].detach().transpose(0, 1) for t, r in
                                    ((q, rows), (k, keys), (v, keys))), seen))
        outs.append(out[rows].detach().transpose(0, 1))
        lses.append(None if lse is None else lse[:, rows])
    case = Case(sequences, outs, None if lse is None else lses, scale or d ** -0.5, softcap,
                sinks)
    if grad:
        cuts = dict(q=cu_q, k=cu_k, v=cu_k, out=cu_q)
        our_gradients(case, out, dict(q=q, k=k, v=v, sinks=sinks),
                      lambda n, g: [g[cuts[n][b]:cuts[n][b + 1]].transpose(0, 1)
                                    for b in range(batch)])
    return case, dtype


def draw_kvcache(rng: random.Random) -> tuple[Case, torch.dtype]:
    dtype, d, dv, kv_heads, heads = heads_and_dims(rng)
    batch = rng.choice([0, 1, 2, 3, 4])
    q_len = rng.choice([1, 1, 1, 2, 3, 4, 5, 8, rng.randint(9, 40), rng.randint(41, 300)])
    capacity = rng.choice([length(rng, low=1), length(rng, low=1), rng.randint(2000, 6000)])
    ends = [rng.randint(0, capacity) for _ in range(batch)]
    if batch and rng.random() < 0.5:
        ends[rng.randrange(batch)] = capacity
    leftpad = rng.random() < 0.3
    starts = [rng.randint(0, e) if leftpad else 0 for e in ends]
    causal = rng.random() < 0.7
    window, softcap, sinks = variants(rng, causal, heads)
    scale = rng.choice([None, rng.uniform(0.02, 0.3)])
    splits = rng.choice([None, None, 1, 2, 3, 5, 8, 16, 33, 64])
    q = (torch.randn(batch, q_len, heads, d, device=DEVICE) * rng.uniform(0.5, 3.0)).to(dtype)
    q = q.transpose(1, 2) if rng.random() < 0.3 else q.transpose(1, 2).contiguous()
    spare = rng.choice([0, 0, 7])  # a view of a longer cache's first slots, sometimes
    keys, values = (torch.full((batch, kv_heads, capacity + spare, w), math.nan,
                               device=DEVICE, dtype=dtype)[:, :, :capacity] for w in (d, dv))
    for cache in (keys, values):  # what lies outside a sequence must never count
        for b in range(batch):
            cache[b, :, starts[b]:ends[b]] = torch.randn(
                kv_heads, ends[b] - starts[b], cache.shape[-1], device=DEVICE)
    lookup = {}
    if batch and rng.random() < 0.5:  # the same keys in shuffled blocks
        block = rng.choice([16, 32, 64, 128, 256])
        per_sequence = -(-capacity // block)
        order = torch.randperm(batch * per_sequence + 3, device=DEVICE)
        table = order[:batch * per_sequence].view(batch, per_sequence).int()
        paged = []
        for cache in (keys, values):
            blocks = torch.full((batch * per_sequence + 3, block, kv_heads, cache.shape[-1]),
                                math.nan, device=DEVICE, dtype=dtype)
            padded = torch.full((batch, kv_heads, per_sequence * block, cache.shape[-1]),
                                math.nan, device=DEVICE, dtype=dtype)
            padded[:, :, :capacity] = cache
            blocks[table.flatten().long()] = padded.view(
                batch, kv_heads, per_sequence, block, -1).permute(0, 2, 3, 1, 4).reshape(
                    batch * per_sequence, block, kv_heads, -1)
            paged.append(blocks)
        key_cache, value_cache = paged
        lookup["block_table"] = table
    else:
        key_cache, value_cache = keys, values
    if leftpad:
        lookup["cache_leftpad"] = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    with_lse = rng.random() < 0.6
    lengths = torch.tensor(ends, dtype=torch.int32, device=DEVICE)

    def call():
        result = attention_with_kvcache(
            q, key_cache, value_cache, lengths, is_causal=causal, scale=scale,
            num_splits=splits, return_lse=with_lse, window_size=window, softcap=softcap,
            sinks=sinks, **lookup)
        return result if with_lse else (result, None)

    out, lse = called(rng, call, False)
    assert out.shape == (batch, heads, q_len, dv), out.shape
    assert lse is None or lse.shape == (batch, heads, q_len), lse.shape
    sequences = []
    for b in range(batch):
        slots = torch.arange(capacity, device=DEVICE)
        seen = window_seen(q_len, capacity, ends[b] - q_len, causal, window) & \
            (slots >= starts[b]) & (slots < ends[b])
        # the reference reads the cache's NaN nowhere: unseen keys are zeroed
        k, v = (t[b].nan_to_num(0.0) for t in (keys, values))
        sequences.append(Sequence(q[b], k, v, seen))
    return Case(sequences, list(out), lse if lse is None else list(lse), scale or d ** -0.5,
                softcap, sinks), dtype


DRAWS = {"attention": draw_dense, "attention_varlen": draw_varlen,
         "attention_with_kvcache": draw_kvcache}
