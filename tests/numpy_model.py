"""The kernels' algorithm in NumPy float64, block for block.

Same grid, same loop bounds (num_k_tiles, mask_start), same masking (the causal diagonal
moved by query_offset) and the same online-softmax updates as the cuTile kernels, in the
exp form of step 1 and the exp2 form of steps 2-6, with the same epilogue (rows that see
no key give 0 and log-sum-exp -inf), so its agreement with plain softmax attention
checks the blocking itself, on any machine. With tile_k and tile_v it is steps 10-11:
Q K^T summed over head-dim chunks, and each output slice computed by its own pass over
the keys, in the kernels' accumulator chunks (output_chunks).
"""

import math

import numpy as np

from cutile_fmha.kernels.step10_head_dim_tiling import output_chunks

LOG2_E = 1.0 / math.log(2)


def _load_rows(x: np.ndarray, start: int, rows: int) -> np.ndarray:
    """x[start:start+rows], padded with NaN like an out-of-bounds load (undetermined)."""
    tile = np.full((rows,) + x.shape[1:], np.nan)
    part = x[start:start + rows]
    tile[:len(part)] = part
    return tile


def tiled_attention(q, k, v, *, scale, query_offset, tile_m, tile_n, use_exp2, tile_k=None,
                    tile_v=None):
    """One (batch, head): q (q_len, D), k and v (k_len, D) -> (out (q_len, D), lse (q_len,)).
    query_offset: None (not causal), or query i sees keys j <= i + query_offset. tile_k,
    tile_v: the head dim tiled as steps 10-11 do (None: whole)."""
    head_dim = q.shape[1]
    tile_k, tile_v = tile_k or head_dim, tile_v or head_dim
    out, lse = np.full_like(q, np.nan), np.full(len(q), np.nan)
    for first in range(0, head_dim, tile_v):  # the CTAs of one query tile, a slice each
        columns = slice(first, first + tile_v)
        out[:, columns], slice_lse = _slice(q, k, v[:, columns], scale, query_offset, tile_m,
                                            tile_n, use_exp2, tile_k)
        if first == 0:  # the first slice writes the log-sum-exp
            lse = slice_lse
    return out, lse


def _slice(q, k, v, scale, query_offset, tile_m, tile_n, use_exp2, tile_k):
    """One output slice (v's columns) of every query tile."""
    q_len, k_len = len(q), len(k)
    causal = query_offset is not None
    out, lse = np.full((q_len, v.shape[1]), np.nan), np.full(q_len, np.nan)
    for q_tile in range(math.ceil(q_len / tile_m)):  # one CTA each
        last_key = q_tile * tile_m + (query_offset or 0) + np.arange(tile_m)[:, None]
        if causal:
            num_k_tiles = math.ceil(min((q_tile + 1) * tile_m + query_offset, k_len) / tile_n)
            mask_start = min((q_tile * tile_m + query_offset) // tile_n, k_len // tile_n)
        else:
            num_k_tiles = math.ceil(k_len / tile_n)
            mask_start = k_len // tile_n
        m_i = np.full((tile_m, 1), -np.inf)
        l_i = np.zeros((tile_m, 1))
        accs = [np.zeros((tile_m, width)) for _, width in output_chunks(v.shape[1])]
        q_blk = _load_rows(q, q_tile * tile_m, tile_m)
        for j in range(num_k_tiles):
            k_blk = _load_rows(k, j * tile_n, tile_n)
            qk = sum(q_blk[:, d:d + tile_k] @ k_blk[:, d:d + tile_k].T
                     for d in range(0, q.shape[1], tile_k))
            if not use_exp2:
                qk = qk * scale
            if j >= mask_start:
                offs_n = j * tile_n + np.arange(tile_n)[None, :]
                visible = offs_n < k_len
                if causal:
                    visible = visible & (last_key >= offs_n)
                qk = np.where(visible, qk, -np.inf)
            # A row that has seen no key yet computes -inf - -inf = NaN, as the kernels do;
            # the epilogue replaces it.
            with np.errstate(invalid="ignore"):
                if use_exp2:
                    m_ij = np.maximum(m_i, qk.max(axis=-1, keepdims=True) * scale * LOG2_E)
                    p = np.exp2(qk * scale * LOG2_E - m_ij)
                    alpha = np.exp2(m_i - m_ij)
                else:
                    m_ij = np.maximum(m_i, qk.max(axis=-1, keepdims=True))
                    p = np.exp(qk - m_ij)
                    alpha = np.exp(m_i - m_ij)
            l_i = l_i * alpha + p.sum(axis=-1, keepdims=True)
            v_blk = np.nan_to_num(_load_rows(v, j * tile_n, tile_n), nan=0.0)  # zero padding
            accs = [acc * alpha + p @ v_blk[:, offset:offset + width]
                     for acc, (offset, width) in zip(accs, output_chunks(v.shape[1]))]
            m_i = m_ij
        with np.errstate(invalid="ignore", divide="ignore"):
            tile_out = np.concatenate(accs, axis=1) / l_i
            tile_lse = m_i + np.log2(l_i) if use_exp2 else m_i + np.log(l_i)
        if use_exp2:
            tile_lse = tile_lse * math.log(2)
        if causal:
            sees_a_key = last_key >= 0
            tile_out = np.where(sees_a_key, tile_out, 0.0)
            tile_lse = np.where(sees_a_key, tile_lse, -np.inf)
        rows = slice(q_tile * tile_m, min((q_tile + 1) * tile_m, q_len))
        out[rows] = tile_out[: rows.stop - rows.start]  # the store drops padding rows
        lse[rows] = tile_lse[: rows.stop - rows.start, 0]
    return out, lse
