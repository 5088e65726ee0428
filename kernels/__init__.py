"""The FMHA kernels, one module per optimization step.

Every kernel has the forward family's parameters, described once in
``cutile_fmha.steps.family.FORWARD`` (with the grid), so the one launcher
(``cutile_fmha.steps``) starts any of them; step 10, which tiles the head dim, adds two
(``FORWARD_TILED_HEAD_DIM``). The backward's kernels are in ``backward.py``.

Step N is step N-1 plus one idea: ``diff kernels/step1_basic.py kernels/step2_exp2.py``.
"""
