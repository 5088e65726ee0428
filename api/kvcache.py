"""Decoding from a KV cache, as flash-attn's ``flash_attn_with_kvcache`` takes it.

``attention_with_kvcache`` attends a few new query rows per sequence to a dense or paged
cache in one or two launches (kernels/decode.py), with no host synchronisation. The
arguments are checked once per shape key (shapes, strides, dtypes, devices, options) and
the launch planned once per key too: a decoding step calls this per layer and token.
"""

import numbers
from dataclasses import dataclass, replace

import torch

from .dropin import _check_variants, checked_once
from .platforms.entry import DECODE_GUESS, runs_on_padded_tiles
from .steps.decode import DecodeShape, decode_forward
from .steps.launcher import DTYPES, PADDED_HEAD_DIM_MULTIPLE, _check_devices, softmax_scale
from .steps.variants import Variants

__all__ = ["attention_with_kvcache"]

HEAD_DIMS = tuple(DECODE_GUESS)  # every platform entry has a decode launch for these
MAX_SPLITS = 64
MIN_BLOCK_SIZE = 16  # each block's rows are one TMA load (kernels/decode.py)


@torch.library.custom_op("cutile_fmha::decode", mutates_args=())
def _decode(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
            key_starts: torch.Tensor | None, key_ends: torch.Tensor | None,
            block_table: torch.Tensor | None, causal: bool, scale: float,
            num_splits: int | None, with_lse: bool, sinks: torch.Tensor | None,
            window_left: int, window_right: int, softcap: float
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse); lse is an empty tensor unless with_lse; the variants as
    ``Variants.operator_arguments`` gives them. What torch.compile sees."""
    variants = Variants.of_operator_arguments(window_left, window_right, softcap, sinks)
    shape = _decode_shape(query, key_cache, value_cache, block_table, key_starts is not None,
                          key_ends is not None, causal, with_lse, num_splits, variants)
    out, lse = decode_forward(query, key_cache, value_cache, shape, scale=scale,
                              key_starts=key_starts, key_ends=key_ends, block_table=block_table,
                              sinks=sinks, keep_buffers=False)
    return out, lse if with_lse else out.new_empty(0, dtype=torch.float32)


@_decode.register_fake
def _(query, key_cache, value_cache, key_starts, key_ends, block_table, causal, scale,
      num_splits, with_lse, sinks, window_left, window_right, softcap):
    lse_shape = query.shape[:-1] if with_lse else (0,)
    return (query.new_empty((*query.shape[:-1], value_cache.shape[-1])),
            query.new_empty(lse_shape, dtype=torch.float32))


def _decode_shape(query, key_cache, value_cache, block_table, has_starts, has_lengths, causal,
                  with_lse, num_splits, variants: Variants | None = None):
    batch, heads, q_len, head_dim = query.shape
    paged = block_table is not None
    kv_heads = key_cache.shape[2] if paged else key_cache.shape[1]
    capacity = block_table.shape[1] * key_cache.shape[1] if paged else key_cache.shape[2]
    return DecodeShape(batch=batch, head_dim=head_dim, kv_heads=kv_heads, group=heads // kv_heads,
                       q_len=q_len, capacity=capacity,
                       block_size=key_cache.shape[1] if paged else None, causal=causal,
                       has_starts=has_starts, has_lengths=has_lengths, write_lse=with_lse,
                       num_splits=num_splits, variants=variants,
                       value_head_dim=None if value_cache.shape[-1] == head_dim
                       else value_cache.shape[-1])


def _check_tensor(name, t, dims: int, what: str):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions {what}, got shape "
                         f"{tuple(t.shape)}")


def _check_lookup(name, t, batch: int, dims: int, what: str):
    _check_tensor(name, t, dims, what)
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32 (as flash-attn takes it), got {t.dtype}")
    if t.shape[0] != batch:
        raise ValueError(f"{name} must have a row per sequence, {batch} (query's batch), got "
                         f"shape {tuple(t.shape)}")


def _check(query, key_cache, value_cache, cache_seqlens, block_table, cache_leftpad,
           is_causal, scale, num_splits, return_lse) -> tuple[DecodeShape, float]:
    _check_tensor("query", query, 4, "(batch, heads, q_len, head_dim)")
    paged = block_table is not None
    layout = "(num_blocks, block_size, kv_heads, head_dim) with a block_table" if paged \
        else "(batch, kv_heads, max_len, head_dim)"
    for name, t in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_tensor(name, t, 4, layout)
    for name, t in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
        if t.dtype != query.dtype:
            raise TypeError(f"query, key_cache and value_cache must share one dtype: query is "
                            f"{query.dtype}, {name} is {t.dtype}")
        if t.stride(-1) != 1:
            raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got "
                             f"strides {t.stride()}")
    if key_cache.shape[:-1] != value_cache.shape[:-1]:
        raise ValueError(f"key_cache and value_cache must have one shape but for the head dim, "
                         f"got {tuple(key_cache.shape)} and {tuple(value_cache.shape)}")
    batch, heads, q_len, head_dim = query.shape
    if not runs_on_padded_tiles(head_dim):
        raise ValueError(f"head dim (last dimension of query) must be a multiple of "
                         f"{PADDED_HEAD_DIM_MULTIPLE} up to {HEAD_DIMS[-1]}, got {head_dim}")
    value_dim = value_cache.shape[-1]
    if not runs_on_padded_tiles(value_dim):
        raise ValueError(f"value_cache's head dim must be a multiple of "
                         f"{PADDED_HEAD_DIM_MULTIPLE} up to {HEAD_DIMS[-1]}, got {value_dim}")
    if key_cache.shape[-1] != head_dim:
        raise ValueError(f"key_cache's head dim must be query's {head_dim}, got shape "
                         f"{tuple(key_cache.shape)}")
    kv_heads = key_cache.shape[2] if paged else key_cache.shape[1]
    if kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"query's head count must be a multiple of the cache's (grouped-query "
                         f"attention), got {heads} and {kv_heads}")
    if q_len < 1:
        raise ValueError(f"query must have at least one row, got shape {tuple(query.shape)}")
    if paged:
        _check_lookup("block_table", block_table, batch, 2, "(batch, max_blocks)")
        block_size = key_cache.shape[1]
        if block_size < MIN_BLOCK_SIZE or block_size & (block_size - 1):
            raise ValueError(f"the paged cache's block_size (key_cache.shape[1]) must be a power "
                             f"of two from {MIN_BLOCK_SIZE} up, got {block_size}")
        if cache_seqlens is None:
            raise ValueError("a paged cache needs cache_seqlens: each sequence's length")
    elif key_cache.shape[0] != batch:
        raise ValueError(f"key_cache must hold query's batch of {batch} sequences, got shape "
                         f"{tuple(key_cache.shape)}")
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_leftpad", cache_leftpad)):
        if t is not None:
            _check_lookup(name, t, batch, 1, "(batch,)")
    if cache_leftpad is not None and cache_seqlens is None:
        raise ValueError("cache_leftpad needs cache_seqlens (where each sequence ends)")
    for name, flag in (("is_causal", is_causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if num_splits is not None:
        if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral):
            raise TypeError(f"num_splits must be an int or None, got {type(num_splits).__name__}")
        if not 1 <= num_splits <= MAX_SPLITS:
            raise ValueError(f"num_splits must be from 1 to {MAX_SPLITS} (or None: the "
                             f"platform's rule), got {num_splits}")
    scale = softmax_scale(scale, head_dim)
    named = [("query", query), ("key_cache", key_cache), ("value_cache", value_cache)]
    named += [(name, t) for name, t in (("cache_seqlens", cache_seqlens),
                                        ("block_table", block_table),
                                        ("cache_leftpad", cache_leftpad)) if t is not None]
    _check_devices(named)
    shape = _decode_shape(query, key_cache, value_cache, block_table, cache_leftpad is not None,
                          cache_seqlens is not None, is_causal and q_len > 1, return_lse,
                          None if num_splits is None else int(num_splits))
    return shape, scale


def attention_with_kvcache(query, key_cache, value_cache, cache_seqlens=None, *,
                           block_table=None, cache_leftpad=None, is_causal=True, scale=None,
                           num_splits=None, return_lse=False, window_size=(-1, -1),
                           softcap=None, sinks=None):
    """Attention of a few new query rows per sequence to its KV cache (decoding), as
    flash-attn's ``flash_attn_with_kvcache``, in SDPA's layout.

    query: (batch, heads, q_len, D), q_len from 1 (decoding) to a few (speculative decoding)
    or a chunk of any length (chunked prefill): the columns, heads per K/V head times q_len,
    each rounded up to a power of two, are one CTA's up to 128 and cut into CTAs of 128
    beyond, each reading the keys up to its last row's; float16 or bfloat16, last
    dimension contiguous; D any multiple of 8 up to 256 (80, 96, 192 run on tiles of the
    next of 64, 128 and 256, reading only the cache's own columns).
    key_cache, value_cache: the cache, already holding the new tokens' keys and values
    (appending is the caller's, as transformers' and vLLM's caches do it; cache_seqlens
    counts them): dense (batch, kv_heads, max_len, D), transformers' layout; or paged
    (num_blocks, block_size, kv_heads, D) with `block_table`, flash-attn's and vLLM's.
    value_cache may have a head dim D_v of its own (DeepSeek's 192/128: any multiple of 8
    up to 256), dense or paged; the output has D_v.
    kv_heads divides heads: each K/V byte is read once for all the query heads sharing it.
    cache_seqlens: int32 (batch,) on the device, each sequence's number of keys; None (a
        dense cache only): every sequence fills the cache.
    block_table: int32 (batch, max_blocks): sequence b's key p is in block
        block_table[b, p // block_size].
    cache_leftpad: int32 (batch,): where each sequence's keys start in a dense cache (left
        padding; flash-attn's name); None: at 0.
    is_causal: query row t of a sequence with n keys sees keys up to n - q_len + t (the new
        tokens are the cache's last); with q_len 1 it changes nothing.
    scale: softmax scale, default 1/sqrt(D).
    num_splits: how many CTAs share each sequence's keys (flash-decoding), 1 to 64; None:
        the platform table's rule from batch x kv_heads x length against the SM count.
    return_lse: also return the log-sum-exp, float32 (batch, heads, q_len), natural log.
    window_size, softcap, sinks: as ``attention`` takes them, the window aligned to each
        sequence's last key, dense or paged, in the decode kernel (split-KV included: the
        splits share the window's keys only); a window bounded on the right without
        is_causal runs there as a causal one whose diagonal is moved by its right side.

    Lengths and block numbers are read on the device only, never on the host: lengths past
    the cache are clamped to it, block numbers to the cache's blocks (wrong numbers give
    wrong rows, never a read outside the cache). A sequence with no keys gives zeros (LSE
    -inf). Forward only (no autograd); a call can be captured in a CUDA graph and runs
    under torch.compile.
    """
    arguments = (query, key_cache, value_cache, cache_seqlens, block_table, cache_leftpad, sinks,
                 is_causal, scale, num_splits, return_lse, window_size, softcap)
    compiling = torch.compiler.is_compiling()  # traced once: one opaque operator
    # a model calls this per layer and token: the checks run once per shape key
    call = _checked_call(*arguments) if compiling else \
        checked_once(_CALLS, _checked_call, arguments, tensors=7)
    if compiling:
        shape = call.shape
        out, lse = _decode(query, key_cache, value_cache, cache_leftpad, cache_seqlens,
                           block_table, shape.causal, call.scale, shape.num_splits, return_lse,
                           sinks, *shape.asked.operator_arguments())
    else:  # the custom operator's work, without its dispatch (about 100 us a call)
        out, lse = decode_forward(query, key_cache, value_cache, call.shape, scale=call.scale,
                                  key_starts=cache_leftpad, key_ends=cache_seqlens,
                                  block_table=block_table, sinks=sinks)
    return (out, lse) if return_lse else out


def _check_variants_of(query, window_size, softcap, sinks) -> Variants:
    """The variants asked for, checked (NO_VARIANTS for none)."""
    if sinks is not None:
        _check_devices([("query", query), ("sinks", sinks)])
    return _check_variants(query, window_size, softcap, sinks)


@dataclass(frozen=True)
class _Call:
    """What attention_with_kvcache keeps per shape key, once its arguments are checked: the
    softmax scale and the decode kernel's shape (its variants in it)."""
    scale: float
    shape: DecodeShape


def _checked_call(query, key_cache, value_cache, cache_seqlens, block_table, cache_leftpad,
                  sinks, is_causal, scale, num_splits, return_lse, window_size,
                  softcap) -> _Call:
    """attention_with_kvcache's arguments checked, and the decode kernel's shape."""
    shape, scale = _check(query, key_cache, value_cache, cache_seqlens, block_table,
                          cache_leftpad, is_causal, scale, num_splits, return_lse)
    variants = _check_variants_of(query, window_size, softcap, sinks)
    return _Call(scale, replace(shape, variants=variants) if variants.any else shape)


# Shape key (the variants and the sinks' tensor key in it) -> its _Call, for arguments
# already checked.
_CALLS: dict[tuple, _Call] = {}

