"""cuTile FMHA as a transformers attention backend: ``attn_implementation="cutile_fmha"``.

    import cutile_fmha.transformers_backend as backend
    backend.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="cutile_fmha")

It honours what transformers passes: ``scaling``, the layer's causality, grouped-query
heads (K/V go to the kernels as they are, with no ``repeat_kv`` copy) and the attention
mask. The kernels compute the causal mask themselves, so the mask may only say what they
can: nothing, or causal with the diagonal aligned to the last key (prefill, and a prefill
after cached keys). A mask that hides anything else, padding for instance, raises a
``ValueError`` rather than being ignored. transformers is an optional dependency
(``pip install -e ".[transformers]"``).
"""

import torch
from torch.nn.attention.bias import causal_lower_right

from .dropin import attention

NAME = "cutile_fmha"
# transformers' own implementations: never replaced.
RESERVED_NAMES = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flash_attention_4",
                  "flex_attention", "paged_attention")
UNSUPPORTED_OPTIONS = ("softcap", "sliding_window", "position_bias", "s_aux")


def register(name: str = NAME) -> str:
    """Registers the backend under `name` with transformers' AttentionInterface (and its
    mask with AttentionMaskInterface, as SDPA's: no mask when causal is enough); returns
    the name to pass as ``attn_implementation``."""
    from transformers import AttentionInterface

    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if name in RESERVED_NAMES:
        raise ValueError(f"name {name!r} is one of transformers' own attention "
                         f"implementations {RESERVED_NAMES}: choose another")
    AttentionInterface.register(name, attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:  # older transformers: masks are made per implementation type
        return name
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


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
    mask = causal_mask_of(attention_mask, q_len, k_len, is_causal)
    out = attention(query, key, value, attn_mask=mask, scale=scaling,
                    enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def causal_mask_of(attention_mask: torch.Tensor | None, q_len: int, k_len: int,
                   is_causal: bool):
    """What the kernels compute for transformers' mask: None (no mask) or the causal mask
    aligned to the last key; ValueError for a mask that hides anything else."""
    if attention_mask is None:
        # A single query (decoding) sees every cached key.
        return causal_lower_right(q_len, k_len) if is_causal and q_len > 1 else None
    allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
    if allowed.dim() != 4 or allowed.shape[-2:] != (q_len, k_len):
        raise ValueError(f"attention_mask must be (batch, 1 or heads, {q_len}, {k_len}), got "
                         f"{tuple(attention_mask.shape)}")
    if bool(allowed.all()):
        return None
    rows = torch.arange(q_len, device=allowed.device)[:, None]
    keys = torch.arange(k_len, device=allowed.device)[None, :]
    if bool((allowed == (keys <= rows + (k_len - q_len))).all()):
        return causal_lower_right(q_len, k_len)
    raise ValueError("attention_mask hides keys other than the causal ones (padding, or a "
                     "sliding window): cuTile FMHA supports no mask and causal masks. Batch "
                     "sequences of one length without padding, or use another "
                     "attn_implementation for padded batches")
