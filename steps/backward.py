"""The backward pass's launcher: dQ, dK, dV from the forward's inputs, output and LSE.

Three launches (kernels/backward.py): Delta = rowsum(O * dO), then dK/dV (one CTA per
key tile of a K/V head), then dQ (one CTA per query tile). The forward must have written
the LSE (``plan_launch(..., with_lse=True)``); the backward rebuilds P from it.
"""

import cuda.tile as ct
import torch

from ..kernels import backward as kernels
from ..platforms import HEAD_DIMS, arch_of_capability
from ..platforms.backward import backward_entry_for
from .family import DKDV, DQ, ROW_DOT, backward_constants
from .launcher import causal_query_offset, softmax_scale, with_hints

ROW_DOT_TILE_M = 64


def backward_kernel(name: str, num_worker_warps: int | None):
    """The named backward kernel ("dkdv" or "dq") with its worker-warps hint."""
    hints = None if num_worker_warps is None else {"num_worker_warps": num_worker_warps}
    return with_hints(getattr(kernels, name), hints)


BACKWARD_FAMILIES = {"dkdv": DKDV, "dq": DQ}


def attention_backward(q, k, v, out, lse, grad_out, *, causal: bool | str = False,
                       scale: float | None = None):
    """(dq, dk, dv) of ``out = attention(q, k, v, causal=causal, scale=scale)`` for the
    incoming gradient ``grad_out``; ``lse`` is the forward's (batch, heads, q_len) float32
    log-sum-exp. dk and dv have k's and v's shapes: with grouped-query heads each sums the
    gradients of the query heads that share it."""
    batch, heads, q_len, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"the backward runs head dims {HEAD_DIMS}, got {head_dim}: past 256 "
                         f"only the forward (steps 10-11) is built")
    if grad_out.shape != out.shape:
        raise ValueError(f"grad_out must have out's shape {tuple(out.shape)}, got "
                         f"{tuple(grad_out.shape)}")
    grad_out = grad_out.to(out.dtype).contiguous()
    query_offset = causal_query_offset(causal, q_len, k.shape[2])
    scale = softmax_scale(scale, head_dim)
    stream = torch.cuda.current_stream(q.device)

    delta = torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device)
    values = {"Out": out, "dOut": grad_out, "Delta": delta, "TILE_M": ROW_DOT_TILE_M,
              "TILE_D": head_dim}
    ct.launch(stream, ROW_DOT.grid(values), kernels.row_dot, ROW_DOT.arguments(values))

    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = {"Q": q, "K": k, "V": v, "dO": grad_out, "Lse": lse, "Delta": delta,
               "dK": dk, "dV": dv, "dQ": dq, "qk_scale": scale,
               "query_offset": query_offset or 0}
    entry = backward_entry_for(arch_of_capability(*torch.cuda.get_device_capability(q.device)))
    for name, family in BACKWARD_FAMILIES.items():
        launch = entry.launches[head_dim][name]
        values = {key: tensors[key] for key in family.names if key in tensors} | \
            backward_constants(head_dim, launch.tiles, query_group=heads // k.shape[1],
                               causal=query_offset is not None)
        ct.launch(stream, family.grid(values), backward_kernel(name, launch.num_worker_warps),
                  family.arguments(values))
    return dq, dk, dv
