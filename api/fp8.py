"""Attention on float8 inputs, as FlashAttention-3's FP8 forward takes them.

    q8, q_descale = to_fp8(query)
    k8, k_descale = to_fp8(key)
    v8_t, v_descale = to_fp8(value, transpose=True)
    out = attention_fp8(q8, k8, v8_t, q_descale=q_descale, k_descale=k_descale,
                        v_descale=v_descale, is_causal=True)   # bfloat16

``attention_fp8`` multiplies on the tensor cores' float8 path (kernels/fp8.py); the
softmax stays float32 and the output is bfloat16. Forward only. Where query or key have
outliers (a few entries far larger than the rest), ``incoherent_rotation(query, key)``
before ``to_fp8`` spreads them over the head dim without changing the scores
(FlashAttention-3's incoherent processing).
"""

import functools
import math

import torch

from .dropin import checked_once
from .platforms import HEAD_DIMS
from .steps.fp8 import fp8_forward, quantize_fp8, quantizes_on_the_gpu
from .steps.launcher import MAX_GRID_YZ, _check_devices, softmax_scale

__all__ = ["attention_fp8", "incoherent_rotation", "to_fp8"]

FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max  # 448
# V^T's rows are TMA-loaded: their length in bytes (keys, one byte each) must be a
# multiple of 16.
KEY_ALIGNMENT = 16

_CHECKED: dict[tuple, float] = {}


def padded_keys(k_len: int) -> int:
    """The row length of a transposed value for `k_len` keys."""
    return -(-k_len // KEY_ALIGNMENT) * KEY_ALIGNMENT


def to_fp8(x: torch.Tensor, *, transpose: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(x in float8_e4m3fn, descale): x (batch, heads, seq_len, D) scaled per (batch, head)
    so that its largest magnitude is e4m3's largest (448), and the float32 (batch, heads)
    factor that undoes it (x ~= x8 * descale; 1 for a head of zeros or no rows). transpose:
    the value's layout that ``attention_fp8`` takes, (batch, heads, D, seq_len rounded up
    to 16, zeros past it). On a GPU with cuTile's float8 (sm_90 on) one kernel reads x once
    and writes x8 (kernels/fp8.py's ``quantize``); the same values as x.float() / descale
    rounded to e4m3 by PyTorch, which runs elsewhere."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or not x.dtype.is_floating_point:
        raise ValueError(f"x must be a floating-point tensor (batch, heads, seq_len, D), got "
                         f"{x.shape if isinstance(x, torch.Tensor) else type(x).__name__}")
    # max |x| per head in one reduction, without a copy of |x| (0 for an empty head)
    amax = torch.linalg.vector_norm(x, math.inf, dim=(2, 3)).float() \
        if x.shape[2] * x.shape[3] else torch.zeros(x.shape[:2], device=x.device)
    descale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    batch, heads, seq_len, head_dim = x.shape
    shape = (batch, heads, head_dim, padded_keys(seq_len)) if transpose else x.shape
    x8 = torch.empty(shape, dtype=FP8, device=x.device)
    if quantizes_on_the_gpu(x, x8):  # one kernel: the same values, read and written once
        quantize_fp8(x, descale, x8, transpose=transpose)
        return x8, descale
    scaled = (x.float() / descale[:, :, None, None]).to(FP8)
    if transpose:
        x8.zero_()
        x8[..., :seq_len] = scaled.transpose(2, 3)
    else:
        x8.copy_(scaled)
    return x8, descale


def incoherent_rotation(query: torch.Tensor, key: torch.Tensor, *,
                        generator: torch.Generator | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """(query R, key R) for one random orthogonal D x D matrix R, a Hadamard matrix's
    columns times random signs over sqrt(D): FlashAttention-3's incoherent processing.
    Scores do not change (query R (key R)^T = query key^T, up to the inputs' rounding), but
    an outlier entry spreads over all D columns, so that ``to_fp8``'s per-head scale leaves
    the other entries more of float8's 3 mantissa bits. The value is not rotated (its
    product with P is not a score).

    query (batch, heads, q_len, D), key (batch, kv_heads, k_len, D): floating point, one
    device, D a power of two. Returned in each input's dtype.
    generator: draws the signs (on the CPU; default torch's)."""
    for name, t in (("query", query), ("key", key)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4 or not t.dtype.is_floating_point:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a floating-point tensor (batch, heads, seq_len, "
                             f"D), got {got}")
    head_dim = query.shape[-1]
    if key.shape[-1] != head_dim or key.device != query.device:
        raise ValueError(f"key must have query's head dim {head_dim} and device "
                         f"{query.device}, got {key.shape[-1]} on {key.device}")
    if head_dim & (head_dim - 1):
        raise ValueError(f"the head dim (query's last dimension) must be a power of two for a "
                         f"Hadamard rotation, got {head_dim}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got "
                        f"{type(generator).__name__}")
    signs = torch.randint(0, 2, (head_dim,), generator=generator).double() * 2 - 1
    rotation = _hadamard(head_dim) * signs / head_dim ** 0.5
    # One product per input in its own dtype, accumulated in float32: R's entries all have
    # one magnitude, so rounded to the dtype R stays orthogonal up to a factor (bfloat16
    # at D=128: scores scaled by 0.9998), and no float32 copy of the input is made.
    return tuple(t @ rotation.to(device=t.device, dtype=t.dtype) for t in (query, key))


@functools.lru_cache(maxsize=8)
def _hadamard(size: int) -> torch.Tensor:
    """Sylvester's size x size Hadamard matrix (entries +-1, rows orthogonal), float64, CPU."""
    matrix = torch.ones(1, 1, dtype=torch.float64)
    while matrix.shape[0] < size:
        matrix = torch.cat([torch.cat([matrix, matrix], 1), torch.cat([matrix, -matrix], 1)])
    return matrix


@functools.lru_cache(maxsize=8)
def _ones(shape: tuple, device: torch.device) -> torch.Tensor:
    return torch.ones(shape, dtype=torch.float32, device=device)


def _descale(t, shape: tuple, device: torch.device) -> torch.Tensor:
    return _ones(shape, device) if t is None else t


def _check(query, key, value_t, q_descale, k_descale, v_descale, is_causal, scale,
           return_lse) -> float:
    for name, t in (("query", query), ("key", key), ("value_t", value_t)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
        if t.dtype != FP8:
            raise TypeError(f"{name} must be torch.float8_e4m3fn (see to_fp8), got {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got "
                             f"strides {t.stride()}")
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim (last dimension of query) must be one of {HEAD_DIMS}, got "
                         f"{head_dim}")
    if key.shape[0] != batch or key.shape[3] != head_dim:
        raise ValueError(f"key must be (batch, kv_heads, k_len, D) with query's batch {batch} "
                         f"and D {head_dim}, got shape {tuple(key.shape)}")
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"query's head count must be a multiple of key's (grouped-query "
                         f"attention), got {heads} and {kv_heads}")
    expected = (batch, kv_heads, head_dim, padded_keys(k_len))
    if tuple(value_t.shape) != expected:
        raise ValueError(f"value_t must be the value transposed, (batch, kv_heads, D, k_len "
                         f"rounded up to {KEY_ALIGNMENT}) = {expected} (to_fp8(value, "
                         f"transpose=True) makes it), got {tuple(value_t.shape)}")
    if min(batch, heads, q_len, k_len) < 1 or max(batch, heads) > MAX_GRID_YZ:
        raise ValueError(f"batch, heads and lengths must be at least 1 (batch and heads at most "
                         f"{MAX_GRID_YZ}), got query {tuple(query.shape)}, key "
                         f"{tuple(key.shape)}")
    named = [("query", query), ("key", key), ("value_t", value_t)]
    for name, t, heads_name, count in (("q_descale", q_descale, "heads", heads),
                                       ("k_descale", k_descale, "kv_heads", kv_heads),
                                       ("v_descale", v_descale, "kv_heads", kv_heads)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dtype != torch.float32 or tuple(t.shape) != (batch, count):
            raise ValueError(f"{name} must be float32 (batch, {heads_name}) = {(batch, count)}, "
                             f"got {t.dtype} {tuple(t.shape)}")
        named.append((name, t))
    for name, flag in (("is_causal", is_causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    scale = softmax_scale(scale, head_dim)
    _check_devices(named)
    return scale


def attention_fp8(query, key, value_t, *, q_descale=None, k_descale=None, v_descale=None,
                  is_causal=False, scale=None, return_lse=False):
    """softmax(query key^T * scale) value on float8 inputs, to a bfloat16 output.

    query: (batch, heads, q_len, D), key: (batch, kv_heads, k_len, D), float8_e4m3fn, D 64,
    128 or 256, kv_heads dividing heads (grouped-query attention).
    value_t: the value transposed, (batch, kv_heads, D, k_len rounded up to 16), float8_e4m3fn,
        finite past k_len: a float8 product needs the keys contiguous
        (``to_fp8(value, transpose=True)`` makes it).
    q_descale: float32 (batch, heads); k_descale, v_descale: float32 (batch, kv_heads), as
        ``to_fp8`` makes them: each input's real values are its stored ones times its
        factor; None: 1. (FlashAttention-3 takes one q_descale per K/V head; here each
        query head has its own.)
    is_causal: query i sees keys 0..i (SDPA's is_causal).
    scale: softmax scale, default 1/sqrt(D).
    return_lse: also return the log-sum-exp, float32 (batch, heads, q_len), natural log.

    The probabilities are rounded to e4m3 for the second product, as FlashAttention-3 does:
    docs/performance.md states the error against the bfloat16 kernel on the same inputs.
    """
    arguments = (query, key, value_t, q_descale, k_descale, v_descale, is_causal, scale,
                 return_lse)
    scale = checked_once(_CHECKED, _check, arguments, tensors=6)
    batch, heads, device = query.shape[0], query.shape[1], query.device
    kv_shape = (batch, key.shape[1])
    out, lse = fp8_forward(query, key, value_t, _descale(q_descale, (batch, heads), device),
                           _descale(k_descale, kv_shape, device),
                           _descale(v_descale, kv_shape, device), causal=is_causal,
                           scale=scale, with_lse=return_lse)
    return (out, lse) if return_lse else out
