"""Shared fixtures."""

from collections import Counter

import pytest
import torch

from cutile_fmha.steps.launcher import causal_query_offset
from cutile_fmha.steps.reference import reference


class ReferencePlan:
    """Stands in for the launcher's plan on the CPU: the float64 reference, in the
    inputs' dtype, with its LSE."""

    def __init__(self, query, key, value, *, causal, scale, with_lse, **_):
        out, lse = reference(query, key, value, causal=causal, scale=scale)
        self.out, self.lse = out.to(query.dtype), (lse.float() if with_lse else None)

    def launch(self):
        return self.out


def reference_backward(query, key, value, out, lse, grad_out, *, causal, scale):
    """The backward in closed form, in float64 (autograd does not run inside an op):
    dV = P^T dO, dS = P * (dO V^T - rowsum(dO * O)), dQ = dS K s, dK = dS^T Q s, summed
    over the query heads of each K/V head."""
    group = query.shape[1] // key.shape[1]
    q, k, v, o, do = (t.double() for t in (query, key, value, out, grad_out))
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    p = torch.exp((q @ k.transpose(-1, -2)) * scale - lse.double()[..., None])
    offset = causal_query_offset(causal, q.shape[2], k.shape[2])
    if offset is not None:
        rows, keys = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
        p = p.masked_fill(keys > rows + offset, 0.0)
    ds = p * (do @ v.transpose(-1, -2) - (do * o).sum(-1, keepdim=True))
    dq, dk, dv = (ds @ k) * scale, (ds.transpose(-1, -2) @ q) * scale, p.transpose(-1, -2) @ do
    dk, dv = (t.unflatten(1, (-1, group)).sum(2) for t in (dk, dv))
    return tuple(t.to(query.dtype) for t in (dq, dk, dv))


@pytest.fixture
def kernels_on_the_cpu(monkeypatch):
    """cutile_fmha.attention's wiring (custom ops, autograd, torch.compile, the
    transformers backend) with the kernels replaced by the reference, so it runs on the
    CPU; the kernels themselves are checked on the GPU (test_gpu_*.py). Gives the calls
    made, by kind ("forward", "backward")."""
    return count_kernel_calls(monkeypatch, forward=ReferencePlan, backward=reference_backward)


@pytest.fixture
def kernel_calls(monkeypatch):
    """The calls cutile_fmha.attention makes to the real kernels, by kind."""
    return count_kernel_calls(monkeypatch)


def count_kernel_calls(monkeypatch, *, forward=None, backward=None) -> Counter:
    """Counts the forward plans and backward launches cutile_fmha.attention makes (so a
    test sees that its model really ran them), optionally through stand-ins."""
    import cutile_fmha.dropin as dropin

    calls = Counter()

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(dropin, "build_plan", counted("forward", forward or dropin.build_plan))
    monkeypatch.setattr(dropin, "attention_backward",
                        counted("backward", backward or dropin.attention_backward))
    return calls
