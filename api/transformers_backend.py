"""cuTile FMHA as a transformers attention backend: ``attn_implementation="cutile_fmha"``.

    import cutile_fmha.transformers_backend as backend
    backend.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="cutile_fmha")

It honours what transformers passes: ``scaling``, the layer's causality, grouped-query
heads (K/V go to the kernels as they are, with no ``repeat_kv`` copy) and the attention
mask, in the forms flash-attention backends take it. Decoding steps (up to
DECODE_MAX_QUERY new tokens, no gradient) run the decode kernel of
``attention_with_kvcache`` on the cache's tensors:
- no padding: no mask, and the dense kernel (causal aligned to the last key);
- padded batches (left or right padding, prefill or decoding, with a DynamicCache or a
  StaticCache): the 2-D padding mask, which ``padding_mask`` (registered with
  AttentionMaskInterface) hands over instead of a 4-D one. Each sequence's first and last
  token come from it on the device, once per forward, and the variable-length kernel runs
  the padded tensors in place: no unpadding copy, no host synchronisation per layer. A
  decoding step of one token gets it as SDPA's boolean key mask (batch, 1, 1, keys) over
  the whole cache instead, whose shape does not grow with a StaticCache: a step compiled
  with mode="reduce-overhead" is one CUDA graph, not one per length;
- packed batches (padding-free training): ``cu_seq_lens_q/k`` and ``max_length_q/k`` when
  transformers passes them (DataCollatorWithFlattening), else positions that restart at 0
  in ``position_ids``.
Sliding windows (``sliding_window``: Mistral, Gemma 2/3, Qwen, gpt-oss), logit softcaps
(``softcap``: Gemma 2) and attention sinks (``s_aux``: gpt-oss) run through the kernels'
variants (``attention()``'s window_size, softcap and sinks; the variable-length kernel's
for padded and packed batches, the decode kernel's for decoding steps), differentiable.
Anything else
(chunked attention, masks that open more than causal, a custom 4-D mask, a padding mask
with holes) raises a ``ValueError`` rather than being ignored. transformers is an optional dependency (``pip install -e ".[transformers]"``).
"""

import torch
from torch.utils.weak import WeakIdKeyDictionary

from . import kvcache
from .dropin import _check_variants, needs_grad, run_attention
from .kernels.padding import NO_PADDING, RUNS
from .platforms.entry import runs_on_padded_tiles
from .steps.launcher import softmax_scale
from .steps.padding import padding_runs
from .steps.variants import NO_VARIANTS
from .steps.varlen import SequenceBounds
from .varlen import varlen_attention

NAME = "cutile_fmha"
# transformers' own implementations: never replaced.
RESERVED_NAMES = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
                  "flex_attention", "paged_attention")
UNSUPPORTED_OPTIONS = ("position_bias",)
SUPPORTED_MASKS = "causal or bidirectional attention with a padding mask, or packed sequences"
# Steps with at most this many new tokens per sequence go to the decode kernel
# (cutile_fmha.kvcache) when no gradient is needed: it reads the cache once per K/V head.
DECODE_MAX_QUERY = 16
# transformers' mask functions (masking_utils) this backend computes itself: causal and
# bidirectional attention, and the two parts of packed sequences' mask (each sequence on
# its own, positions restarting), combined by and_masks.
_MASK_PARTS_HANDLED = frozenset((
    "causal_mask_function", "bidirectional_mask_function", "and_masks.<locals>.and_mask",
    # the sliding window's part: the layer passes its width as sliding_window, which the
    # kernels take as a window (attention_forward)
    "sliding_window_overlay.<locals>.inner_mask",
    "packed_sequence_mask_function.<locals>.inner_mask",
    "remap_positions_for_packed_sequence.<locals>.inner_mask"))


def register(name: str = NAME) -> str:
    """Registers the backend under `name` with transformers' AttentionInterface, and
    ``padding_mask`` with its AttentionMaskInterface; returns the name to pass as
    ``attn_implementation``."""
    from transformers import AttentionInterface

    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(f"name {name!r} is one of transformers' own attention "
                         f"implementations {RESERVED_NAMES}: choose another")
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # older transformers: masks are made per implementation type
        return name
    AttentionMaskInterface.register(name, padding_mask)
    return name


# A constant to torch.compile (evaluated while tracing, not traced: dynamo cannot read a
# closure's cells): the functions a mask combines are fixed by the code that made it.
@torch.compiler.assume_constant_result
def _unhandled_mask_parts(mask_function) -> tuple[str, ...]:
    """The mask functions `mask_function` is made of that this backend does not compute."""
    return tuple(sorted(_mask_parts(mask_function) - _MASK_PARTS_HANDLED))


def _mask_parts(mask_function) -> set[str]:
    """The qualified names of `mask_function` and of the mask functions it combines."""
    parts, stack = set(), [mask_function]
    while stack:
        function = stack.pop()
        parts.add(function.__qualname__)
        for cell in function.__closure__ or ():
            contents = cell.cell_contents
            stack += [f for f in (contents if isinstance(contents, tuple) else (contents,))
                      if callable(f) and hasattr(f, "__qualname__")]
    return parts


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                 mask_function=None, attention_mask: torch.Tensor | None = None, **kwargs):
    """transformers' mask, as this backend takes it: None where there is no padding, else
    the 2-D boolean padding mask (batch, tokens seen), True on real tokens, as
    flash-attention backends take it. Checks, with one look at the device per forward
    (not per layer), that each row's real tokens are one run (left or right padding).
    Raises ValueError for what the kernels do not compute (see SUPPORTED_MASKS)."""
    if mask_function is not None:
        unhandled = _unhandled_mask_parts(mask_function)
        if unhandled:
            raise ValueError(f"cuTile FMHA supports {SUPPORTED_MASKS}; this model's mask also "
                             f"uses {list(unhandled)} (chunks or another overlay): use "
                             f"another attn_implementation for it")
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"cuTile FMHA takes transformers' 2-D padding mask, got a mask of "
                         f"shape {tuple(attention_mask.shape)}")
    # As flash-attention's: the last kv_length tokens; a StaticCache's mask may be shorter
    # than its kv_length (the cache's unused slots are not in it).
    attention_mask = attention_mask[:, -kv_length:]
    padded, keys = _checked_runs(attention_mask)
    if padded is False and attention_mask.shape[1] == kv_length:
        return None
    attention_mask = attention_mask.bool()
    if q_length == 1:
        # A decoding step. With a StaticCache the mask covers the tokens so far, one more
        # each step, up to the whole cache. As SDPA's 4-D key mask over the whole cache (its
        # unused slots are no keys), which transformers hands on as it is, its shape stays
        # the same from step to step, the last included: a compiled step is one CUDA graph,
        # not one per length.
        unused = kv_length - attention_mask.shape[1]
        attention_mask = torch.nn.functional.pad(attention_mask, (0, unused))[:, None, None, :]
    if not torch.compiler.is_compiling():  # checked above, and its bounds found if on CUDA
        _BOUNDS_OF_MASK[attention_mask] = {} if keys is None else {_KEYS: keys}
    return attention_mask


_HOLES = ("attention_mask has padding between real tokens: cuTile FMHA supports "
          f"{SUPPORTED_MASKS} (left or right padding)")


def _checked_runs(mask: torch.Tensor) -> tuple[bool | None, tuple | None]:
    """(whether any token of the 2-D `mask` (nonzero on real tokens) is padding, and on a
    CUDA device its key bounds as ``key_bounds_of_padding`` gives them, else None). Raises
    ValueError where a row has padding between real tokens: one look at the device (in a
    compiled graph none, a device assert instead, and whether it is padded is None)."""
    if mask.is_cuda and not torch.compiler.is_compiling():
        runs = padding_runs(mask)  # one launch for the bounds and the check
        statuses = runs[2].tolist()
        if RUNS in statuses:
            raise ValueError(_HOLES)
        return any(status != NO_PADDING for status in statuses), (runs[0], runs[1])
    return _check_one_run(mask.bool()), None


def _check_one_run(mask: torch.Tensor) -> bool | None:
    """``_checked_runs``' check of a boolean mask in PyTorch operations: whether any token
    is padding (None in a compiled graph)."""
    starts_of_runs = mask[:, :1].sum(-1) + (mask[:, 1:] & ~mask[:, :-1]).sum(-1)
    holes = (starts_of_runs > 1).any()
    if torch.compiler.is_compiling():
        torch._assert_async(~holes, _HOLES)
        return None
    holes, padded = torch.stack([holes, (~mask).any()]).tolist()
    if holes:
        raise ValueError(_HOLES)
    return padded


# Per mask checked to be one run of real tokens per row, its key bounds (under _KEYS) and
# its sequence bounds per query length: the mask is made once per forward and handed to
# every layer, so the bounds are computed once too. padding_mask enters the key masks it
# makes; a key mask from elsewhere is checked the first time it is seen.
_BOUNDS_OF_MASK = WeakIdKeyDictionary()
_KEYS = "keys"


def is_key_mask(mask: torch.Tensor, query: torch.Tensor, k_len: int) -> bool:
    """Whether `mask` is a boolean key mask (batch, 1, 1, k_len) for one query row, as SDPA
    takes it (True: a key to attend to): `padding_mask`'s form for a StaticCache's step."""
    return (mask.dim() == 4 and mask.dtype == torch.bool and query.shape[2] == 1
            and tuple(mask.shape) == (query.shape[0], 1, 1, k_len))


def _remembered_for_mask(mask: torch.Tensor, entry, make):
    """_BOUNDS_OF_MASK[mask][entry], made by make(what is remembered of the mask, None
    when it was never seen) the first time; made on every call in a compiled graph."""
    if torch.compiler.is_compiling():
        return make(None)
    cached = _BOUNDS_OF_MASK.get(mask)
    if cached and entry in cached:
        return cached[entry]
    made = make(cached)
    _BOUNDS_OF_MASK.setdefault(mask, {})[entry] = made
    return made


def key_bounds_of_padding(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_starts, key_ends), int32 (batch,): each row's real tokens (one run:
    `padding_mask` checked) as the mask's columns. What a decoding step needs of
    ``bounds_of_padding``: a step makes them once per token, and each small kernel costs the
    host microseconds, which generate() with a DynamicCache waits for."""
    def make(cached):
        key_mask = mask.dim() == 4
        rows = mask[:, 0, 0] if key_mask else mask
        if key_mask and cached is None:  # a key mask not made by padding_mask: checked
            _, keys = _checked_runs(rows)  # once (in a compiled graph, a device assert)
            if keys is not None:
                return keys
        if rows.is_cuda and not torch.compiler.is_compiling():
            runs = padding_runs(rows)
            return runs[0], runs[1]
        counts = rows.sum(-1, dtype=torch.int32)
        key_starts = rows.int().argmax(-1).to(torch.int32)  # the first True (0 in none)
        return key_starts, key_starts + counts
    return _remembered_for_mask(mask, _KEYS, make)


def bounds_of_padding(mask: torch.Tensor, q_len: int) -> SequenceBounds:
    """Each row's real tokens (``key_bounds_of_padding``) as sequence bounds: keys are the
    mask's columns, queries the last q_len of them; for a key mask (``is_key_mask``), the
    query is each row's last key."""
    def make(_):
        key_starts, key_ends = key_bounds_of_padding(mask)
        if mask.dim() == 4:  # a key mask: the query is each row's last key, none with no keys
            return SequenceBounds(torch.zeros_like(key_starts),
                                  (key_ends - key_starts).clamp(max=1), key_starts, key_ends)
        before_queries = mask.shape[1] - q_len  # the queries are the last q_len columns
        return SequenceBounds((key_starts - before_queries).clamp(0, q_len),
                              (key_ends - before_queries).clamp(0, q_len), key_starts, key_ends)
    return _remembered_for_mask(mask, q_len, make)


_PACKED_OF_POSITIONS = WeakIdKeyDictionary()


def packed_sequences_of_positions(position_ids: torch.Tensor | None, q_len: int):
    """(cu_seqlens int32, longest) of one batch row of sequences packed end to end, found
    where positions do not go up by one (transformers' rule); None for one sequence per
    row. Looks at the device once per forward (cached for the other layers): asked only
    for a batch of one row, since a model hands its (1, q_len) positions to every row of a
    larger batch too, where looking would stall the host once per forward for nothing."""
    if position_ids is None or position_ids.shape != (1, q_len) or q_len == 1:
        return None
    if not torch.compiler.is_compiling() and position_ids in _PACKED_OF_POSITIONS:
        return _PACKED_OF_POSITIONS[position_ids]
    steps = torch.diff(position_ids[0], prepend=position_ids[0, :1] - 1)
    starts = torch.nonzero(steps != 1)[:, 0].tolist()
    found = None
    if starts:  # the first token starts a sequence whatever its position
        bounds = [0, *starts, q_len]
        found = (torch.tensor(bounds, dtype=torch.int32, device=position_ids.device),
                 max(end - start for start, end in zip(bounds, bounds[1:])))
    if not torch.compiler.is_compiling():
        _PACKED_OF_POSITIONS[position_ids] = found
    return found


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                      value: torch.Tensor, attention_mask: torch.Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: query (batch, heads, q_len, D), key and value
    (batch, kv_heads, k_len, D); returns ((batch, q_len, heads, D), None)."""
    for option in UNSUPPORTED_OPTIONS:
        if kwargs.get(option) is not None:
            raise ValueError(f"cuTile FMHA does not support {option}: use another "
                             f"attn_implementation for this model")
    if kwargs.get("output_attentions"):
        raise ValueError("cuTile FMHA never forms the attention weights: output_attentions "
                         "needs attn_implementation='eager'")
    if dropout:
        raise ValueError(f"cuTile FMHA has no attention dropout, got dropout={dropout}: set "
                         f"the config's attention_dropout to 0.0")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    q_len, k_len = query.shape[2], key.shape[2]
    causal = is_causal and q_len > 1  # a single query sees every key before it anyway
    if attention_mask is not None and attention_mask.dim() != 2 and \
            not is_key_mask(attention_mask, query, k_len):
        raise ValueError(f"cuTile FMHA supports {SUPPORTED_MASKS}, as transformers hands them "
                         f"to it (a 2-D padding mask, or for one query row a boolean key mask "
                         f"(batch, 1, 1, keys), or none); got a mask of shape "
                         f"{tuple(getattr(attention_mask, 'shape', ()))} (a custom mask?): use "
                         f"another attn_implementation for it")
    packed = None
    if kwargs.get("cu_seq_lens_q") is not None:
        packed = (kwargs["cu_seq_lens_q"].to(torch.int32), kwargs["cu_seq_lens_k"].to(torch.int32),
                  int(kwargs["max_length_q"]), int(kwargs["max_length_k"]))
    elif attention_mask is None and query.shape[0] == 1 and (
            found := packed_sequences_of_positions(kwargs.get("position_ids"), q_len)) is not None:
        packed = (found[0], found[0], found[1], found[1])
    decode = (q_len <= DECODE_MAX_QUERY and runs_on_padded_tiles(query.shape[-1])
              and runs_on_padded_tiles(value.shape[-1]) and not needs_grad(query, key, value))
    variants, sinks = _layer_variants(query, is_causal, **kwargs)
    # attention_with_kvcache's names for them (decoding steps)
    variant_options = dict(window_size=tuple(-1 if side is None else side
                                             for side in variants.window or (None, None)),
                           softcap=variants.softcap, sinks=sinks)
    if packed is not None:
        if query.shape[0] != 1:
            raise ValueError(f"packed sequences come in one batch row, got {query.shape[0]}")
        cu_q, cu_k, max_q, max_k = packed
        out, _ = varlen_attention(query, key, value, SequenceBounds.packed(cu_q, cu_k), max_q,
                                  max_k, causal=causal, scale=scaling, variants=variants,
                                  sinks=sinks)
    elif attention_mask is not None:
        if decode:  # the query rows are the newest tokens: real in every sequence
            key_starts, key_ends = key_bounds_of_padding(attention_mask)
            out = kvcache.attention_with_kvcache(query, key, value, key_ends,
                                                 cache_leftpad=key_starts, is_causal=causal,
                                                 scale=scaling, **variant_options)
        else:
            out, _ = varlen_attention(query, key, value, bounds_of_padding(attention_mask, q_len),
                                      q_len, k_len, causal=causal, scale=scaling, fill=0.0,
                                      variants=variants, sinks=sinks)
    elif decode:
        out = kvcache.attention_with_kvcache(query, key, value, is_causal=causal, scale=scaling,
                                             **variant_options)
    else:
        aligned = is_causal if variants.any else causal  # a window keeps its alignment at q_len 1
        out, _ = run_attention(query, key, value, "bottom_right" if aligned else "none",
                               softmax_scale(scaling, query.shape[-1]), False, variants, sinks)
    return out.transpose(1, 2).contiguous(), None


def _layer_variants(query, is_causal: bool, *, sliding_window=None, softcap=None, s_aux=None,
                    **_):
    """(Variants, sinks) of a layer's transformers options: sliding_window W is the keys
    q - W + 1 .. q (its sliding_window_overlay), flash-attn's window (W - 1, 0), aligned,
    as the causal mask, to the last key (the newest tokens are the queries)."""
    if sliding_window is None and softcap is None and s_aux is None:
        return NO_VARIANTS, None
    window = (-1, -1)
    if sliding_window is not None:
        window = (sliding_window - 1, 0 if is_causal else sliding_window - 1)
    return _check_variants(query, window, softcap, s_aux), s_aux
