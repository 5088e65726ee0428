"""The drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

``attention`` takes SDPA's names, layout and meaning and runs the fastest step with this
GPU's platform entry; ``attention_with_lse`` also returns each query row's log-sum-exp.
The tutorial's knobs (which step, another platform's entry) are on
``cutile_fmha.steps.plan_launch``.
"""

import numbers

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from .steps.launcher import Names, build_plan

__all__ = ["attention", "attention_with_lse"]

SDPA_NAMES = Names(q="query", k="key", v="value")
ALIGNMENT_OF_VARIANT = {CausalVariant.UPPER_LEFT: "top_left",
                        CausalVariant.LOWER_RIGHT: "bottom_right"}


def _causal(query, key, attn_mask, is_causal):
    """The launcher's `causal` for SDPA's attn_mask and is_causal, or a clear error."""
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    if attn_mask is None:
        return is_causal
    if not isinstance(attn_mask, CausalBias):
        raise TypeError(
            f"attn_mask must be None or a torch.nn.attention.bias.CausalBias "
            f"(causal_upper_left / causal_lower_right), got {type(attn_mask).__name__}: the "
            f"kernels compute the causal mask themselves and take no mask tensor")
    if is_causal:
        raise ValueError("attn_mask is a CausalBias, so is_causal must be False (as in SDPA)")
    lengths = (query.shape[-2], key.shape[-2])
    if (attn_mask.seq_len_q, attn_mask.seq_len_kv) != lengths:
        raise ValueError(f"attn_mask was made for (q_len, k_len) = "
                         f"{(attn_mask.seq_len_q, attn_mask.seq_len_kv)}, but query and key "
                         f"have {lengths}")
    return ALIGNMENT_OF_VARIANT[attn_mask.variant]


def _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, with_lse):
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise ValueError(f"dropout_p must be 0.0: the kernels have no dropout, got {dropout_p}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    tensors = (("query", query), ("key", key), ("value", value))
    for name, t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if (not enable_gqa and query.dim() == key.dim() == value.dim() == 4
            and not query.shape[1] == key.shape[1] == value.shape[1]):
        raise ValueError(f"query has {query.shape[1]} heads and key/value {key.shape[1]}/"
                         f"{value.shape[1]}: pass enable_gqa=True for grouped-query attention "
                         f"(as SDPA asks)")
    if torch.is_grad_enabled() and any(t.requires_grad for _, t in tensors):
        needs = ", ".join(name for name, t in tensors if t.requires_grad)
        raise RuntimeError(f"{needs} requires grad, but cuTile FMHA has no backward pass yet: "
                           f"call it under torch.no_grad() (or on detached tensors) for "
                           f"inference")
    causal = _causal(query, key, attn_mask, is_causal)
    return build_plan(query, key, value, causal=causal, scale=scale, step="fastest",
                      platform=None, out=None, with_lse=with_lse, names=SDPA_NAMES)


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False) -> torch.Tensor:
    """A drop-in for ``torch.nn.functional.scaled_dot_product_attention`` (inference).

    query: (batch, heads, q_len, D); key, value: (batch, kv_heads, k_len, D); float16 or
    bfloat16 on one CUDA device, last dimension contiguous; D in (64, 128, 256).
    attn_mask: None, or a ``CausalBias`` from ``torch.nn.attention.bias``:
        ``causal_upper_left(q_len, k_len)`` (the same as is_causal=True) or
        ``causal_lower_right(q_len, k_len)`` (query i sees keys 0..i + k_len - q_len, as in
        a KV-cache prefill). A row that sees no key (lower right, q_len > k_len) gives 0.
        Other masks raise TypeError.
    dropout_p: must be 0.0. is_causal: upper-left causal mask, as SDPA's.
    scale: softmax scale, default 1/sqrt(D).
    enable_gqa: allow kv_heads < heads (heads a multiple of kv_heads); query head h reads
        K/V head h // (heads // kv_heads), with no copy of K or V.

    Anything the kernels cannot serve raises ``TypeError`` or ``ValueError`` naming the
    argument; inputs that require grad raise ``RuntimeError`` (no backward pass yet).
    """
    return _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 with_lse=False).launch()


def attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                       scale=None, enable_gqa=False) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention``, and each query row's log-sum-exp of its scaled scores.

    Returns (out, lse): lse is float32 of shape (batch, heads, q_len), in natural log, as
    flash-attn returns it: log(sum_j exp(scale * q_i . k_j)) over the keys row i sees,
    -inf for a row that sees no key. What training and context parallelism combine
    partial attentions with.
    """
    plan = _plan(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                 with_lse=True)
    return plan.launch(), plan.lse
