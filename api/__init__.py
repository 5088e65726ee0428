"""cuTile FMHA: fused multi-head attention in NVIDIA cuTile.

    from cutile_fmha import attention
    out = attention(query, key, value, is_causal=True)      # as F.scaled_dot_product_attention

See ``cutile_fmha.dropin`` for ``attention`` and ``attention_with_lse``, and
``cutile_fmha.steps`` for the tutorial's steps and the planning API.
"""

__all__ = ["attention", "attention_with_lse"]


def __getattr__(name):
    # Imported on first use: `python -m cutile_fmha.platforms.environment` must not load
    # the kernels (and cuda.tile, torch) before it checks that they can load.
    if name in __all__:
        from . import dropin
        return getattr(dropin, name)
    raise AttributeError(f"module 'cutile_fmha' has no attribute {name!r}")
