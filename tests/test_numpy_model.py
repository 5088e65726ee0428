"""The kernels' tiling and online softmax, in float64, against the float64 reference."""

import numpy as np
import pytest
import torch

from cutile_fmha.steps.launcher import causal_query_offset
from cutile_fmha.steps.reference import reference
from numpy_model import tiled_attention

SHAPES = [  # (q_len, k_len): tile multiples, odd tails, single rows, q and k differing
    (1, 1), (17, 17), (64, 64), (100, 100), (257, 257), (1, 300), (300, 1), (70, 33), (33, 130),
]
TILES = [(64, 64), (128, 64), (64, 32), (32, 128)]
CAUSAL = [False, "top_left", "bottom_right"]


def model_and_reference(q_len, k_len, tile_m, tile_n, causal, use_exp2, seed, head_dim=16,
                        **head_dim_tiles):
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((n, head_dim)) * 2 for n in (q_len, k_len, k_len))
    scale = 1 / np.sqrt(head_dim)
    got = tiled_attention(q, k, v, scale=scale, tile_m=tile_m, tile_n=tile_n,
                          query_offset=causal_query_offset(causal, q_len, k_len),
                          use_exp2=use_exp2, **head_dim_tiles)
    want = reference(*(torch.from_numpy(t)[None, None] for t in (q, k, v)), causal=causal,
                     scale=scale)
    return got, tuple(t[0, 0].numpy() for t in want)


@pytest.mark.parametrize("use_exp2", [False, True], ids=["exp", "exp2"])
@pytest.mark.parametrize("causal", CAUSAL, ids=str)
@pytest.mark.parametrize("tile_m,tile_n", TILES)
@pytest.mark.parametrize("q_len,k_len", SHAPES)
def test_tiled_online_softmax_matches_plain_softmax(q_len, k_len, tile_m, tile_n, causal, use_exp2):
    (out, lse), (want_out, want_lse) = model_and_reference(
        q_len, k_len, tile_m, tile_n, causal, use_exp2, seed=[q_len, k_len, tile_m, tile_n,
                                                              CAUSAL.index(causal), use_exp2])
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "a row was never written"
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", CAUSAL, ids=str)
@pytest.mark.parametrize("head_dim,tile_k,tile_v", [(320, 64, 320), (768, 64, 384),
                                                    (1024, 128, 512), (448, 64, 448)])
def test_head_dim_tiling_matches_plain_softmax(head_dim, tile_k, tile_v, causal):
    """Steps 10-11: Q K^T over head-dim chunks, output slices each a pass of its own, in
    accumulator chunks of powers of two (320 = 256 + 64, 448 = 256 + 128 + 64)."""
    (out, lse), (want_out, want_lse) = model_and_reference(
        70, 130, 64, 32, causal, True, seed=head_dim, head_dim=head_dim, tile_k=tile_k,
        tile_v=tile_v)
    assert not np.isnan(out).any() and not np.isnan(lse).any(), "a column was never written"
    np.testing.assert_allclose(out, want_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-11, atol=1e-11)


def test_rows_that_see_no_key_give_zero_and_minus_infinity():
    """Bottom-right with 300 queries and 33 keys: the first 267 rows see no key."""
    (out, lse), (want_out, want_lse) = model_and_reference(300, 33, 64, 32, "bottom_right",
                                                           True, seed=1)
    assert (out[:267] == 0).all() and np.isneginf(lse[:267]).all()
    assert (want_out[:267] == 0).all() and np.isneginf(want_lse[:267]).all()
    assert np.isfinite(lse[267:]).all() and np.abs(out[267:]).sum() > 0


def test_model_would_catch_a_wrong_mask():
    """Sanity of the test itself: the two alignments differ, and so does no mask."""
    results = [model_and_reference(40, 70, 16, 16, causal, True, seed=0)[0][0]
               for causal in CAUSAL]
    for i in range(len(results)):
        for j in range(i):
            assert not np.allclose(results[i], results[j])
