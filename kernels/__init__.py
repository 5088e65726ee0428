"""The FMHA kernels, one module per optimization step.

Every kernel has the same parameters, so the one launcher (``cutile_fmha.steps``)
starts any of them:

    fmha(Q, K, V, Out, qk_scale, TILE_D, TILE_M, TILE_N, CAUSAL)

Q, Out: (batch, heads, q_len, D); K, V: (batch, heads, k_len, D). Grid:
(cdiv(q_len, TILE_M), heads, batch); each CTA owns TILE_M query rows of one head.

Step N is step N-1 plus one idea: ``diff kernels/step1_basic.py kernels/step2_exp2.py``.
"""
