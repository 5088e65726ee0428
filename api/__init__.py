"""cuTile FMHA: fused multi-head attention in NVIDIA cuTile.

    from cutile_fmha import attention, attention_varlen
    out = attention(query, key, value, is_causal=True)      # as F.scaled_dot_product_attention
    out = attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, is_causal=True)
    out = attention_with_kvcache(q, key_cache, value_cache, cache_seqlens)  # decoding

See ``cutile_fmha.dropin`` for ``attention`` and ``attention_with_lse``,
``cutile_fmha.varlen`` for ``attention_varlen`` (packed sequences of different lengths, as
flash-attn's ``flash_attn_varlen_func``), ``cutile_fmha.kvcache`` for
``attention_with_kvcache`` (decoding from a dense or paged KV cache, as flash-attn's
``flash_attn_with_kvcache``), ``cutile_fmha.fp8`` for ``attention_fp8``, ``to_fp8`` and
``incoherent_rotation`` (float8 inputs, as FlashAttention-3's FP8 forward),
``cutile_fmha.distributed`` for ``ring_attention`` (one sequence across GPUs), and
``cutile_fmha.steps`` for the tutorial's steps and the planning API.
"""

_MODULE_OF = {"attention": "dropin", "attention_with_lse": "dropin",
              "attention_varlen": "varlen", "attention_with_kvcache": "kvcache",
              "attention_fp8": "fp8", "to_fp8": "fp8", "incoherent_rotation": "fp8",
              "ring_attention": "distributed"}
__all__ = list(_MODULE_OF)


def __getattr__(name):
    # Imported on first use: `python -m cutile_fmha.platforms.environment` must not load
    # the kernels (and cuda.tile, torch) before it checks that they can load.
    if name in _MODULE_OF:
        import importlib
        return getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    raise AttributeError(f"module 'cutile_fmha' has no attribute {name!r}")
