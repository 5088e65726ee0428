"""The kernels' tiling and online softmax, in float64, against plain attention."""

import numpy as np
import pytest

from numpy_model import reference_attention, tiled_attention

SHAPES = [  # (q_len, k_len): tile multiples, odd tails, single rows, q and k differing
    (1, 1), (17, 17), (64, 64), (100, 100), (257, 257), (1, 300), (300, 1), (70, 33), (33, 130),
]
TILES = [(64, 64), (128, 64), (64, 32), (32, 128)]


@pytest.mark.parametrize("use_exp2", [False, True], ids=["exp", "exp2"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile_m,tile_n", TILES)
@pytest.mark.parametrize("q_len,k_len", SHAPES)
def test_tiled_online_softmax_matches_plain_softmax(q_len, k_len, tile_m, tile_n, causal, use_exp2):
    rng = np.random.default_rng([q_len, k_len, tile_m, tile_n, causal, use_exp2])
    head_dim = 16
    q, k, v = (rng.standard_normal((n, head_dim)) * 2 for n in (q_len, k_len, k_len))
    scale = 1 / np.sqrt(head_dim)
    got = tiled_attention(q, k, v, scale=scale, causal=causal, tile_m=tile_m, tile_n=tile_n,
                          use_exp2=use_exp2)
    want = reference_attention(q, k, v, scale=scale, causal=causal)
    assert not np.isnan(got).any(), "an output row was never written"
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_model_would_catch_a_wrong_mask():
    """Sanity of the test itself: dropping the causal mask changes the answer."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((40, 8)) for _ in range(3))
    full = tiled_attention(q, k, v, scale=0.3, causal=False, tile_m=16, tile_n=16, use_exp2=True)
    causal = reference_attention(q, k, v, scale=0.3, causal=True)
    assert not np.allclose(full, causal)
