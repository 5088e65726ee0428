"""Variable-length batches, as flash-attn's ``flash_attn_varlen_func`` takes them.

``attention_varlen`` runs a batch of sequences of different lengths packed end to end
(no padding), each attending only to its own keys, in one launch and with no host
synchronisation. The same custom operators serve the transformers backend's padded
batches, where each sequence sits in a batch row of its own (``varlen_attention`` takes
both layouts).
"""

from dataclasses import dataclass

import torch

from .dropin import _check_variants, checked_once, needs_grad, require_lse
from .steps.launcher import (DTYPES, MAX_GRID_YZ, Names, _check_devices, _check_shapes,
                             rows_contiguous, softmax_scale)
from .steps.family import UNUSED_ARRAY
from .steps.variants import NO_VARIANTS, Variants, sinks_gradient
from .steps.backward import row_dot
from .steps.varlen import (ForwardPlan, SequenceBounds, forward_plan, new_output,
                           varlen_backward, varlen_forward)

__all__ = ["attention_varlen"]


# Custom operators, as the dense ones in dropin.py: one opaque call for torch.compile, with
# autograd. The tensors are (batch rows, heads, rows, D), the bounds int32 per sequence
# (SequenceBounds: with no ends, the starts are cumulative lengths).
@torch.library.custom_op("cutile_fmha::varlen_forward", mutates_args=())
def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             query_starts: torch.Tensor, query_ends: torch.Tensor | None,
             key_starts: torch.Tensor, key_ends: torch.Tensor | None, max_seqlen_q: int,
             max_seqlen_k: int, causal: bool, scale: float, with_lse: bool,
             fill: float | None, sinks: torch.Tensor | None, window_left: int,
             window_right: int, softcap: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse); lse is an empty tensor unless with_lse. max_seqlen_k sizes the
    backward's grid; `fill`: what rows outside every sequence hold (steps/varlen.py); the
    variants as ``Variants.operator_arguments`` gives them."""
    bounds = SequenceBounds(query_starts, query_ends, key_starts, key_ends)
    variants = Variants.of_operator_arguments(window_left, window_right, softcap, sinks)
    out, lse = varlen_forward(query, key, value, bounds, max_seqlen_q, causal=causal,
                              scale=scale, with_lse=with_lse, fill=fill, variants=variants,
                              sinks=sinks)
    return out, lse if with_lse else out.new_empty(0, dtype=torch.float32)


@_forward.register_fake
def _(query, key, value, query_starts, query_ends, key_starts, key_ends, max_seqlen_q,
      max_seqlen_k, causal, scale, with_lse, fill, sinks, window_left, window_right, softcap):
    lse_shape = query.shape[:-1] if with_lse else (0,)
    return new_output(query, value.shape[-1]), query.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("cutile_fmha::varlen_backward", mutates_args=())
def _backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
              query_starts: torch.Tensor, query_ends: torch.Tensor | None,
              key_starts: torch.Tensor, key_ends: torch.Tensor | None, max_seqlen_q: int,
              max_seqlen_k: int, causal: bool, scale: float, fill: float | None,
              sinks: torch.Tensor | None, window_left: int, window_right: int,
              softcap: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks: empty without sinks). Rows outside every sequence hold out 0
    (a padded batch's fill) or are none (packed), so they add nothing to dsinks."""
    grad_out = rows_contiguous(grad_out.to(out.dtype))
    bounds = SequenceBounds(query_starts, query_ends, key_starts, key_ends)
    # the sinks' gradient needs Delta too: made once here for both, else by the kernels
    delta = None if sinks is None else row_dot(out, grad_out)
    dq, dk, dv = varlen_backward(
        query, key, value, out, lse, grad_out, bounds, max_seqlen_q, max_seqlen_k,
        causal=causal, scale=scale, fill=fill, delta=delta,
        variants=Variants.of_operator_arguments(window_left, window_right, softcap, None))
    return dq, dk, dv, sinks_gradient(sinks, lse, delta)


@_backward.register_fake
def _(grad_out, query, key, value, out, lse, query_starts, query_ends, key_starts, key_ends,
      max_seqlen_q, max_seqlen_k, causal, scale, fill, sinks, window_left, window_right,
      softcap):
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            lse.new_empty(0) if sinks is None else torch.empty_like(sinks))


def _save_for_backward(ctx, inputs, output):
    query, key, value, *bounds = inputs[:7]
    max_seqlen_q, max_seqlen_k, causal, scale, with_lse, fill, sinks = inputs[7:14]
    require_lse("varlen_forward", with_lse)
    ctx.save_for_backward(query, key, value, *output, *bounds, sinks)
    ctx.max_seqlen_q, ctx.max_seqlen_k = max_seqlen_q, max_seqlen_k
    ctx.causal, ctx.scale, ctx.fill = causal, scale, fill
    ctx.window_and_softcap = inputs[14:]


def _gradients(ctx, grad_out, _grad_lse):
    *saved, sinks = ctx.saved_tensors
    dq, dk, dv, dsinks = _backward(grad_out, *saved, ctx.max_seqlen_q, ctx.max_seqlen_k,
                                   ctx.causal, ctx.scale, ctx.fill, sinks,
                                   *ctx.window_and_softcap)
    return (dq, dk, dv) + (None,) * 10 + (dsinks if sinks is not None else None,) + (None,) * 3


_forward.register_autograd(_gradients, setup_context=_save_for_backward)


def _check_cu_seqlens(name: str, cu_seqlens, query: torch.Tensor) -> None:
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (as flash-attn takes it), got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 entries (at least 2), got shape "
                         f"{tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != query.device:
        raise ValueError(f"{name} must be on query's device {query.device} (the kernels read "
                         f"it there, with no copy to the host), got {cu_seqlens.device}")


def _check_max_seqlen(name: str, max_seqlen) -> None:
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int):
        raise TypeError(f"{name} must be an int, got {type(max_seqlen).__name__}")
    if max_seqlen < 0:
        raise ValueError(f"{name} must be at least 0, got {max_seqlen}")


def _check_packed(query, key, value) -> None:
    names = Names(q="query", k="key", v="value")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise ValueError(f"{name} must have 3 dimensions (total tokens, heads, head_dim), "
                             f"packed as flash-attn packs them, got shape {tuple(t.shape)}")
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key and value must have the same number of tokens, got shapes "
                         f"{tuple(key.shape)} and {tuple(value.shape)}")
    if query.shape[0] and key.shape[0]:  # the dense checks, on the (1, heads, tokens, D) views
        _check_shapes(*(t.transpose(0, 1)[None] for t in (query, key, value)), names,
                      padded=True)
    elif query.dtype not in DTYPES or {key.dtype, value.dtype} != {query.dtype}:
        raise TypeError(f"query, key and value must share one dtype, float16 or bfloat16, got "
                        f"{query.dtype}, {key.dtype}, {value.dtype}")


def attention_varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     *, is_causal=False, scale=None, return_lse=False, window_size=(-1, -1),
                     softcap=None, sinks=None):
    """Attention over a batch of sequences of different lengths packed end to end, as
    flash-attn's ``flash_attn_varlen_func``.

    query, key: (total_q, heads, D), (total_k, kv_heads, D); value (total_k, kv_heads, D_v),
    kv_heads dividing heads (grouped-query: query head h reads K/V head h // (heads //
    kv_heads), no copy); float16 or bfloat16 on one CUDA device, last dimension contiguous;
    D as ``attention`` takes it (any multiple of 8 up to 256, D_v too, forward and backward;
    320-1024 forward, D_v = D).
    cu_seqlens_q, cu_seqlens_k: int32 (batch + 1,) on query's device: sequence i is query
    rows cu_seqlens_q[i]..cu_seqlens_q[i+1]-1 and key rows cu_seqlens_k[i]..
    cu_seqlens_k[i+1]-1. They must start at 0, never decrease and end at total_q and
    total_k; that is not checked, since it would read them on the host: bounds that are
    wrong give wrong rows, never a read or write outside the tensors.
    max_seqlen_q, max_seqlen_k: the longest query and key sequence, which size the grid.
    Not checked either (that would read cu_seqlens on the host). Below the truth, the
    rows past the grid get NaN: the output and LSE in the forward, the gradients in the
    backward; loud, never silently wrong.
    is_causal: each sequence's query i sees its keys 0..i + k_len - q_len: the diagonal is
        aligned to the sequence's last key (bottom right, as flash-attn aligns varlen
        batches; the same as top left where q_len == k_len). A sequence with no keys, and
        a query row that sees none, give zeros (LSE -inf).
    scale: softmax scale, default 1/sqrt(D). return_lse: also return the log-sum-exp,
        float32 (heads, total_q), natural log, as flash-attn returns it.
    window_size, softcap, sinks: as ``attention`` takes them (D up to 256, forward and
        backward), the window aligned to each sequence's last key as the causal mask is
        (flash-attn's).

    Returns out (total_q, heads, D_v), contiguous when query is, or (out, lse).
    Differentiable in query, key, value and sinks (autograd and torch.compile); the LSE is
    not.
    """
    arguments = (query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                 is_causal, scale, return_lse, window_size, softcap, sinks)
    if torch.compiler.is_compiling():
        scale, variants = _check(*arguments)
        no_grad = False
    else:  # a model calls this per layer: the checks run once per shape key
        call = checked_once(_CHECKED, _checked_call, arguments, tensors=5)
        no_grad = not needs_grad(query, key, value, sinks)
        if no_grad and query.shape[0] and key.shape[0]:
            return _launch_planned(call, query, key, value, cu_seqlens_q, cu_seqlens_k,
                                   max_seqlen_q, is_causal, return_lse, sinks)
        scale, variants = call.scale, call.variants
    # Where no gradient flows, one as_strided view per tensor (a view costs microseconds);
    # else transposes and (un)squeezes, whose backwards are views too (as_strided's and
    # indexing's copy the gradient: out[0]'s zero-filled and copied it, 4% of a backward).
    if query.shape[0] == 0:  # nothing to compute (SDPA returns an empty tensor too)
        out = query.new_empty(query.shape[:-1] + value.shape[-1:])
        lse = query.new_empty((query.shape[1], 0), dtype=torch.float32)
        return (out, lse) if return_lse else out
    if key.shape[0] == 0:
        # No keys at all: one zero row the bounds never reach keeps the launch (and the
        # gradient's path to key and value) as for any batch; every row gives 0.
        key, value = (torch.cat([t, t.new_zeros((1,) + t.shape[1:])]) for t in (key, value))
    bounds = SequenceBounds.packed(cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous())
    rows = [_one_batch_row(t) if no_grad else t.transpose(0, 1)[None]
            for t in (query, key, value)]
    out, lse = varlen_attention(*rows, bounds, max_seqlen_q, max_seqlen_k, causal=is_causal,
                                scale=scale, with_lse=return_lse, variants=variants,
                                sinks=sinks)
    out = out.as_strided(query.shape[:-1] + value.shape[-1:],
                         (out.stride(2), out.stride(1), 1)) if no_grad else \
        out.squeeze(0).transpose(0, 1)
    return (out, lse.squeeze(0)) if return_lse else out


def _one_batch_row(t: torch.Tensor) -> torch.Tensor:
    """Packed (tokens, heads, D) as the kernels' (1, heads, tokens, D), in one view."""
    tokens, heads, head_dim = t.shape
    return t.as_strided((1, heads, tokens, head_dim),
                        (tokens * t.stride(0), t.stride(1), t.stride(0), 1))


@dataclass
class _Call:
    """What attention_varlen keeps per shape key, once its arguments are checked: the
    softmax scale and the variants, and for calls with no gradient the launch's plan."""
    scale: float
    variants: Variants
    plan: ForwardPlan | None = None  # made by the first such call


def _checked_call(*arguments) -> _Call:
    return _Call(*_check(*arguments))


# Shape key -> _Call, for arguments already checked.
_CHECKED: dict[tuple, _Call] = {}


def _launch_planned(call: _Call, query, key, value, cu_seqlens_q, cu_seqlens_k,
                    max_seqlen_q, is_causal, return_lse, sinks):
    """attention_varlen's result where no gradient flows and there are queries and keys:
    the shape's plan launched on the packed tensors themselves, which the kernel sees as
    one batch row (a host view per tensor cost about 2 us; what the host spends per
    call is what a model's decoding step waits for)."""
    cu_q, cu_k = cu_seqlens_q.contiguous(), cu_seqlens_k.contiguous()
    bounds = SequenceBounds.packed_arrays(cu_q, cu_k)
    out = new_output(query, value.shape[-1])
    if call.plan is None:
        call.plan = forward_plan(*(_one_batch_row(t) for t in (query, key, value)),
                                 SequenceBounds.packed(cu_q, cu_k), max_seqlen_q,
                                 causal=is_causal, scale=call.scale, with_lse=return_lse,
                                 variants=call.variants)
    if not return_lse:
        call.plan.launch(query, key, value, out, UNUSED_ARRAY, bounds, sinks)
        return out
    lse = query.new_empty(query.shape[1::-1], dtype=torch.float32)  # (heads, tokens)
    call.plan.launch(query, key, value, out, lse, bounds, sinks)
    return out, lse


def _check(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
           is_causal, scale, return_lse, window_size=(-1, -1), softcap=None,
           sinks=None) -> tuple[float, Variants]:
    """attention_varlen's arguments checked; the softmax scale and the variants."""
    _check_packed(query, key, value)
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, query)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, query)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have one entry per sequence "
                         f"and one more, so the same length, got {cu_seqlens_q.numel()} and "
                         f"{cu_seqlens_k.numel()}")
    if cu_seqlens_q.numel() - 1 > MAX_GRID_YZ:
        raise ValueError(f"at most {MAX_GRID_YZ} sequences, got {cu_seqlens_q.numel() - 1}")
    _check_max_seqlen("max_seqlen_q", max_seqlen_q)
    _check_max_seqlen("max_seqlen_k", max_seqlen_k)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if not isinstance(return_lse, bool):
        raise TypeError(f"return_lse must be a bool, got {type(return_lse).__name__}")
    scale = softmax_scale(scale, query.shape[-1])
    # attention()'s checks, on the packed query's (1, heads, tokens, D) view.
    variants = _check_variants(query.transpose(0, 1)[None], window_size, softcap, sinks)
    named = [("query", query), ("key", key), ("value", value)]
    _check_devices(named + ([("sinks", sinks)] if sinks is not None else []))  # last
    return scale, variants


def varlen_attention(query, key, value, bounds: SequenceBounds, max_seqlen_q: int,
                     max_seqlen_k: int, *, causal: bool, scale: float | None,
                     with_lse: bool = False, fill: float | None = None,
                     variants: Variants = NO_VARIANTS, sinks: torch.Tensor | None = None):
    """The variable-length operator on (batch rows, heads, rows, D) tensors, checked as
    their producer (``attention_varlen``, the transformers backend) made them: (out, lse)
    with lse None unless `with_lse`. Differentiable in query, key, value and sinks."""
    scale = softmax_scale(scale, query.shape[-1])
    grad = needs_grad(query, key, value, sinks)
    if not (torch.compiler.is_compiling() or grad):
        # The custom operator's work without its dispatch (it costs more than the launch).
        return varlen_forward(query, key, value, bounds, max_seqlen_q, causal=causal,
                              scale=scale, with_lse=with_lse, fill=fill, variants=variants,
                              sinks=sinks)
    out, lse = _forward(query, key, value, *bounds.tensors(), max_seqlen_q, max_seqlen_k, causal,
                        scale, with_lse or grad, fill, sinks,
                        *variants.operator_arguments())
    return out, (lse.detach() if with_lse else None)
