"""The drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

``attention`` takes SDPA's names, layout and meaning and runs the fastest step with this
GPU's platform entry; ``attention_with_lse`` also returns each query row's log-sum-exp.
The tutorial's knobs (which step, another platform's entry) are on
``cutile_fmha.steps.plan_launch``.
"""

import math
import numbers

import torch
from torch.nn.attention.bias import CausalBias, CausalVariant

from .steps.backward import attention_backward, row_dot
from .steps.launcher import (HEAD_DIMS, HeadGroupLaunches, LaunchPlan, Names, _check_devices,
                             _check_shapes, build_head_group_plan, build_plan, causal_query_offset,
                             checked_kv_heads_per_launch, is_padded, past_32_bits, remember,
                             rows_contiguous, softmax_scale)
from .steps.family import UNUSED_ARRAY
from .steps.variants import NO_VARIANTS, Variants, sinks_gradient, variants_forward

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


def _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """SDPA's arguments checked; (the ops' causal name, the softmax scale)."""
    # a float or int first: the numbers.Real check alone costs a call 0.3 us
    if type(dropout_p) not in (float, int) and (isinstance(dropout_p, bool)
                                               or not isinstance(dropout_p, numbers.Real)):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise ValueError(f"dropout_p must be 0.0: the kernels have no dropout, got {dropout_p}")
    if not isinstance(enable_gqa, bool):
        raise TypeError(f"enable_gqa must be a bool, got {type(enable_gqa).__name__}")
    if not (isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor)
            and isinstance(value, torch.Tensor)):
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if (not enable_gqa and query.dim() == key.dim() == value.dim() == 4
            and not query.shape[1] == key.shape[1] == value.shape[1]):
        raise ValueError(f"query has {query.shape[1]} heads and key/value {key.shape[1]}/"
                         f"{value.shape[1]}: pass enable_gqa=True for grouped-query attention "
                         f"(as SDPA asks)")
    causal = _causal(query, key, attn_mask, is_causal)
    return CAUSAL_NAMES[causal], softmax_scale(scale, query.shape[-1])


# The ops take causal as a string: False, True ("top_left") or "bottom_right".
CAUSAL_NAMES = {False: "none", True: "top_left", "top_left": "top_left",
                "bottom_right": "bottom_right"}


def _launcher_causal(name: str):
    return False if name == "none" else name


# Custom operators, so that torch.compile sees one opaque call with known output shapes
# (the register_fake functions) instead of tracing into the cuTile launch.
def tensor_key(t: torch.Tensor | None) -> tuple | None:
    """What a launch depends on of a tensor besides its address."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


# What checked_once remembers at most per cache: a training loop over packed batches of
# ever new lengths makes a new key per batch.
MAX_CHECKED_KEYS = 4096


def checked_once(checked: dict, check, arguments: tuple, tensors: int):
    """check(*arguments), run once per key: the tensor keys of the first `tensors`
    arguments and the others with their types (True is not 1 to a check), and remembered
    in `checked` (emptied when full). Arguments that make no key (not tensors, unhashable
    options) are checked on every call: it is for check to say what is wrong with them."""
    key = []  # one list, then one tuple: 3.7 us a call on a CPU, joined tuples took 4.6
    try:
        for t in arguments[:tensors]:
            key.append(tensor_key(t))
        for option in arguments[tensors:]:
            key += (type(option), option)
        key = tuple(key)
        result = checked.get(key)
    except (AttributeError, TypeError):
        return check(*arguments)
    if result is None:
        result = remember(checked, key, check(*arguments), MAX_CHECKED_KEYS)
    return result


# (tensor keys, causal, scale, with_lse) -> the plan made for the first call with that key:
# later calls launch its kernel, grid and constants on their own tensors (MAX_CHECKED_KEYS
# at most).
_PLANS: dict[tuple, LaunchPlan] = {}


def plan_for(query, key, value, causal: str, scale: float, with_lse: bool
             ) -> tuple[LaunchPlan | HeadGroupLaunches, bool]:
    """(the plan of this shape key, whether it was made now and so still holds this call's
    tensors): made, and the arguments checked, once per key. Tensors past the kernels'
    32-bit strides whole run in groups of heads where those fit (``HeadGroupLaunches``)."""
    shape_key = (tensor_key(query), tensor_key(key), tensor_key(value), causal, scale, with_lse)
    plan = _PLANS.get(shape_key)
    if plan is not None:
        return plan, False
    options = dict(causal=_launcher_causal(causal), scale=scale, step="fastest",
                   platform=None, out=None, with_lse=with_lse, names=SDPA_NAMES)
    groups = build_head_group_plan(query, key, value, **options) \
        if any(map(past_32_bits, (query, key, value))) else None
    if groups is not None:
        remember(_PLANS, shape_key, groups, MAX_CHECKED_KEYS)
        return groups, False
    plan = build_plan(query, key, value, **options)
    remember(_PLANS, shape_key, plan.without_tensors(), MAX_CHECKED_KEYS)
    return plan, True


def forward_launch(query, key, value, causal: str, scale: float, with_lse: bool):
    """(out, lse or None): the forward's launch, planned (and so checked) once per shape
    key. What the custom operator runs, and what eager calls run without its dispatch."""
    plan, made_now = plan_for(query, key, value, causal, scale, with_lse)
    if made_now:
        return plan.launch(), plan.lse
    out = torch.empty_like(query)
    lse = torch.empty(query.shape[:-1], dtype=torch.float32, device=query.device) \
        if with_lse else UNUSED_ARRAY
    plan.launch_on(query, key, value, out, lse)
    return out, lse if with_lse else None


@torch.library.custom_op("cutile_fmha::forward", mutates_args=())
def _forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, causal: str,
             scale: float, with_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse); lse is an empty tensor unless with_lse."""
    out, lse = forward_launch(query, key, value, causal, scale, with_lse)
    return out, lse if with_lse else out.new_empty(0, dtype=torch.float32)


@_forward.register_fake
def _(query, key, value, causal, scale, with_lse):
    lse_shape = query.shape[:-1] if with_lse else (0,)
    return torch.empty_like(query), query.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("cutile_fmha::backward", mutates_args=())
def _backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
              value: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
              sinks: torch.Tensor | None, causal: str, scale: float, window_left: int,
              window_right: int, softcap: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dsinks: empty without sinks); the window and softcap as
    ``Variants.operator_arguments`` gives them (the LSE holds the sinks' terms)."""
    variants = Variants.of_operator_arguments(window_left, window_right, softcap, None)
    grad_out = rows_contiguous(grad_out.to(out.dtype))
    # the sinks' gradient needs Delta too: made once here for both, else by the kernels
    delta = None if sinks is None else row_dot(out, grad_out)
    dq, dk, dv = attention_backward(query, key, value, out, lse, grad_out,
                                    causal=_launcher_causal(causal), scale=scale,
                                    variants=variants, delta=delta)
    return dq, dk, dv, sinks_gradient(sinks, lse, delta)


@_backward.register_fake
def _(grad_out, query, key, value, out, lse, sinks, causal, scale, window_left, window_right,
      softcap):
    return (torch.empty_like(query), torch.empty_like(key), torch.empty_like(value),
            lse.new_empty(0) if sinks is None else torch.empty_like(sinks))


def require_lse(operator: str, with_lse: bool) -> None:
    """The backward rebuilds P from the forward's LSE: a forward operator saved for autograd
    must have written it."""
    if not with_lse:
        raise RuntimeError(f"cutile_fmha::{operator} ran without its LSE, which the backward "
                           f"needs: call it with with_lse=True when inputs require grad")


def _save_for_backward(ctx, inputs, output):
    query, key, value, causal, scale, with_lse = inputs
    require_lse("forward", with_lse)
    ctx.save_for_backward(query, key, value, *output)
    ctx.causal, ctx.scale = causal, scale


def _gradients(ctx, grad_out, _grad_lse):  # the LSE is an output, not differentiable
    dq, dk, dv, _ = _backward(grad_out, *ctx.saved_tensors, None, ctx.causal, ctx.scale,
                              *NO_VARIANTS.operator_arguments())
    return dq, dk, dv, None, None, None


_forward.register_autograd(_gradients, setup_context=_save_for_backward)


def _check_variants(query, window_size, softcap, sinks) -> Variants:
    """The variants asked for, checked (NO_VARIANTS for none)."""
    if sinks is None and softcap is None and (window_size is None or (
            window_size == (-1, -1) and type(window_size) is tuple
            and type(window_size[0]) is int and type(window_size[1]) is int)):
        return NO_VARIANTS  # the defaults, at once: what nearly every call passes
    window = None
    if window_size is not None:
        if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2 and all(
                isinstance(side, int) and not isinstance(side, bool) for side in window_size)):
            raise TypeError(f"window_size must be a pair of ints (left, right), -1 for "
                            f"unbounded, got {window_size!r}")
        if min(window_size) < -1:
            raise ValueError(f"window_size's sides must be -1 (unbounded) or at least 0, got "
                             f"{tuple(window_size)}")
        if tuple(window_size) != (-1, -1):
            window = tuple(None if side == -1 else side for side in window_size)
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"softcap must be a float or None, got {type(softcap).__name__}")
        if not (math.isfinite(softcap) and softcap > 0):
            raise ValueError(f"softcap must be a positive finite number (None: no cap), got "
                             f"{softcap}")
    if sinks is not None:
        if not isinstance(sinks, torch.Tensor):
            raise TypeError(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
        if not sinks.dtype.is_floating_point or tuple(sinks.shape) != (query.shape[1],):
            raise ValueError(f"sinks must be a floating-point tensor of one logit per query "
                             f"head, shape ({query.shape[1]},), got {sinks.dtype} "
                             f"{tuple(sinks.shape)}")
    variants = Variants(window=window, softcap=None if softcap is None else float(softcap),
                        sinks=sinks is not None)
    if variants.any and query.shape[-1] > HEAD_DIMS[-1]:
        raise ValueError(f"window_size, softcap and sinks run head dims up to {HEAD_DIMS[-1]}, "
                         f"got {query.shape[-1]}")
    return variants


@torch.library.custom_op("cutile_fmha::forward_variants", mutates_args=())
def _forward_variants(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      sinks: torch.Tensor | None, causal: str, scale: float, with_lse: bool,
                      window_left: int, window_right: int, softcap: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) with the variants (``Variants.operator_arguments``), for torch.compile
    and autograd. lse is an empty tensor unless with_lse."""
    out, lse = variants_launch(query, key, value, sinks, causal, scale, with_lse,
                               Variants.of_operator_arguments(window_left, window_right,
                                                              softcap, sinks))
    return out, lse if with_lse else out.new_empty(0, dtype=torch.float32)


@_forward_variants.register_fake
def _(query, key, value, sinks, causal, scale, with_lse, window_left, window_right, softcap):
    lse_shape = query.shape[:-1] if with_lse else (0,)
    return (query.new_empty(query.shape[:-1] + value.shape[-1:]),
            query.new_empty(lse_shape, dtype=torch.float32))


def _save_variants_for_backward(ctx, inputs, output):
    query, key, value, sinks, causal, scale, with_lse, *window_and_softcap = inputs
    require_lse("forward_variants", with_lse)
    ctx.save_for_backward(query, key, value, sinks, *output)
    ctx.causal, ctx.scale, ctx.window_and_softcap = causal, scale, window_and_softcap


def _variants_gradients(ctx, grad_out, _grad_lse):
    """dQ, dK, dV from the backward with the window and softcap, which rebuilds P from the
    LSE (holding the sinks' terms), and the sinks' own gradient (``sinks_gradient``)."""
    query, key, value, sinks, out, lse = ctx.saved_tensors
    dq, dk, dv, dsinks = _backward(grad_out, query, key, value, out, lse, sinks, ctx.causal,
                                   ctx.scale, *ctx.window_and_softcap)
    return dq, dk, dv, dsinks if sinks is not None else None, *(None,) * 6


_forward_variants.register_autograd(_variants_gradients,
                                    setup_context=_save_variants_for_backward)


def _check_padded_shapes(query, key, value) -> tuple[int | None]:
    """The variants' kernel's checks; returns (K/V heads per launch: None where the tensors
    fit cuTile's 32-bit strides whole, else ``kv_heads_per_launch``'s groups), a tuple so
    that ``checked_once`` remembers None too."""
    per_launch = checked_kv_heads_per_launch(query, key, value, SDPA_NAMES, padded=True)
    _check_devices([("query", query), ("key", key), ("value", value)])
    return (per_launch,)


# Shape keys whose tensors the variants' kernel has checked, with their K/V heads per launch.
_PADDED_CHECKED: dict[tuple, tuple[int | None]] = {}


def variants_launch(query, key, value, sinks, causal: str, scale: float, with_lse: bool,
                    variants: Variants):
    """(out, lse or None) of the variants' kernel (any head dim it pads, value's possibly
    not query's), the shapes checked once per shape key; past cuTile's 32-bit strides
    whole, per batch entry and group of heads."""
    (per_launch,) = checked_once(_PADDED_CHECKED, _check_padded_shapes, (query, key, value),
                                 tensors=3)
    query_offset = causal_query_offset(_launcher_causal(causal), query.shape[2], key.shape[2])
    if sinks is not None:
        _check_devices([("query", query), ("sinks", sinks)])
    return variants_forward(query, key, value, query_offset=query_offset, scale=scale,
                            with_lse=with_lse, variants=variants, sinks=sinks,
                            kv_heads_per_launch=per_launch)


def needs_grad(*tensors) -> bool:
    """Whether autograd will want a gradient of any of `tensors` (None: none)."""
    if torch.is_grad_enabled():
        for t in tensors:  # a loop, not any() over a generator: a call's host time
            if t is not None and t.requires_grad:
                return True
    return False


def run_variants(query, key, value, sinks, causal: str, scale: float, with_lse: bool,
                 variants: Variants):
    """(out, lse or None) with `variants`: through the custom operator under torch.compile
    or where a gradient flows (``_variants_gradients``), else straight to the launch."""
    grad = needs_grad(query, key, value, sinks)
    if torch.compiler.is_compiling() or grad:
        out, lse = _forward_variants(query, key, value, sinks, causal, scale, with_lse or grad,
                                     *variants.operator_arguments())
        return out, (lse.detach() if with_lse else None)
    return variants_launch(query, key, value, sinks, causal, scale, with_lse, variants)


def run_attention(query, key, value, causal: str, scale: float, with_lse: bool,
                  variants: Variants = NO_VARIANTS, sinks=None):
    """(out, lse or None): the variants' kernel where a variant is asked for or the head
    dims need padding (``is_padded``), else the fastest step."""
    if variants.any or is_padded(query, value):
        return run_variants(query, key, value, sinks, causal, scale, with_lse, variants)
    return run_forward(query, key, value, causal, scale, with_lse)


def run_forward(query, key, value, causal: str, scale: float, with_lse: bool):
    """(out, lse or None) through the custom operator where autograd or torch.compile needs
    it, else straight to the launch (the operator's dispatch costs more than the launch)."""
    if torch.compiler.is_compiling() or needs_grad(query, key, value):
        out, lse = _forward(query, key, value, causal, scale, with_lse or
                            needs_grad(query, key, value))
        return out, lse if with_lse else None
    return forward_launch(query, key, value, causal, scale, with_lse)


class _NothingToAttend(torch.autograd.Function):
    """The output of a call with no batch entry, query row or key: zeros of (batch, heads,
    q_len, value's head dim) in query's layout, as SDPA gives, and zero gradients."""

    @staticmethod
    def forward(ctx, query, key, value, sinks):
        ctx.inputs = [None if t is None else (t.shape, t.dtype, t.device)
                      for t in (query, key, value, sinks)]
        if value.shape[-1] == query.shape[-1]:
            return torch.zeros_like(query)
        return query.new_zeros(query.shape[:-1] + value.shape[-1:])

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(None if spec is None else torch.zeros(spec[0], dtype=spec[1], device=spec[2])
                     for spec in ctx.inputs)


def nothing_to_attend(query, key) -> bool:
    """Whether a call has no batch entry, query row or key (or no head): SDPA's result then
    needs no kernel."""
    return query.numel() == 0 or key.numel() == 0


def attend_nothing(query, key, value, sinks, with_lse: bool):
    """(out, lse or None) of a call that ``nothing_to_attend``, after the checks every call
    gets: zeros (no row sees a key), an LSE of -inf, or each head's sink logit with sinks
    (the row's softmax holds the sink alone)."""
    _check_shapes(query, key, value, SDPA_NAMES, padded=True, empty=True)
    _check_devices([("query", query), ("key", key), ("value", value)] +
                   ([] if sinks is None else [("sinks", sinks)]))
    out = _NothingToAttend.apply(query, key, value, sinks)
    if not with_lse:
        return out, None
    rows = query.shape[:-1]
    if sinks is None:
        return out, torch.full(rows, -math.inf, dtype=torch.float32, device=query.device)
    return out, sinks.detach().float()[None, :, None].expand(rows).contiguous()


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
              enable_gqa=False, *, window_size=(-1, -1), softcap=None,
              sinks=None) -> torch.Tensor:
    """A drop-in for ``torch.nn.functional.scaled_dot_product_attention``.

    query, key: (batch, heads, q_len, D), (batch, kv_heads, k_len, D); value (batch,
    kv_heads, k_len, D_v); float16 or bfloat16 on one CUDA device, last dimension
    contiguous. D and D_v: any multiple of 8 up to 256 (64, 128 and 256 run the fastest
    step; the others, and D_v other than D as DeepSeek's 192/128, run step 9's code on
    tiles of the next of 64/128/256, zero-padded), or D = D_v a multiple of 64 from 320 to
    1024 but 832 (steps 10-11 tile the head dim; forward only: a backward past D=256
    raises ValueError). The output has value's head dim and query's layout (a (batch,
    seq, heads, D) tensor viewed as (batch, heads, seq, D) gets an output strided so too,
    as from SDPA's cuDNN backend: transposing it back copies nothing).
    attn_mask: None, or a ``CausalBias`` from ``torch.nn.attention.bias``:
        ``causal_upper_left(q_len, k_len)`` (the same as is_causal=True) or
        ``causal_lower_right(q_len, k_len)`` (query i sees keys 0..i + k_len - q_len, as in
        a KV-cache prefill). A row that sees no key (lower right, q_len > k_len) gives 0.
        Other masks raise TypeError.
    dropout_p: must be 0.0. is_causal: upper-left causal mask, as SDPA's.
    scale: softmax scale, default 1/sqrt(D).
    enable_gqa: allow kv_heads < heads (heads a multiple of kv_heads); query head h reads
        K/V head h // (heads // kv_heads), with no copy of K or V.

    Beyond SDPA, keyword-only (D up to 256, forward and backward, differentiable in
    query, key, value and sinks):
    window_size: (left, right), flash-attn's sliding window: query i sees keys from
        i - left to i + right around its diagonal key i (i + k_len - q_len under
        causal_lower_right), -1 for unbounded; with a causal mask right is 0. Key tiles
        outside every row's window are skipped: O(N * window) work.
    softcap: scores become softcap * tanh(scores / softcap) before the softmax (Gemma 2);
        None: no cap.
    sinks: (heads,) one logit per query head that joins each row's softmax denominator and
        adds no value (gpt-oss); the LSE includes it.

    Anything the kernels cannot serve raises ``TypeError`` or ``ValueError`` naming the
    argument. Differentiable: with inputs that require grad the forward also writes the
    log-sum-exp, which the cuTile backward (``cutile_fmha.steps.backward``) rebuilds P from.
    A batch of 0, or q_len or k_len 0, gives SDPA's result with no launch: an empty output,
    or zeros where there is no key, and zero gradients.
    """
    causal, scale = _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    variants = _check_variants(query, window_size, softcap, sinks)
    if nothing_to_attend(query, key):
        return attend_nothing(query, key, value, sinks, False)[0]
    return run_attention(query, key, value, causal, scale, False, variants, sinks)[0]


def attention_with_lse(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                       scale=None, enable_gqa=False, *, window_size=(-1, -1), softcap=None,
                       sinks=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``attention``, and each query row's log-sum-exp of its scaled scores.

    Returns (out, lse): lse is float32 of shape (batch, heads, q_len), in natural log, as
    flash-attn returns it: log(sum_j exp(scale * q_i . k_j)) over the keys row i sees,
    -inf for a row that sees no key (with sinks, its head's sink logit). What training and
    context parallelism combine partial attentions with. Gradients flow through out; lse is
    not differentiable.
    """
    causal, scale = _check(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    variants = _check_variants(query, window_size, softcap, sinks)
    if nothing_to_attend(query, key):
        return attend_nothing(query, key, value, sinks, True)
    out, lse = run_attention(query, key, value, causal, scale, True, variants, sinks)
    return out, lse.detach()
