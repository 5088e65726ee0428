"""An FP8 forward: step 9's kernel on float8_e4m3fn Q, K and V, with dequantization factors.

Hopper's tensor cores multiply float8 at twice the bfloat16 rate (QGMMA), and Q, K and V
take half the bytes. Each input comes with float32 descale factors (FlashAttention-3's
q_descale, k_descale, v_descale), per (batch, head) of Q and per (batch, K/V head) of K and
V: the real values are the stored ones times the factor. Q K^T then only needs its scale multiplied by q_descale x k_descale, and
the output by v_descale; the softmax is float32 as before. P, in [0, 1], is converted to
e4m3 for the second product, which loses the probabilities below about 2^-10 of the row's
largest (FlashAttention-3 does the same).

A float8 warpgroup product needs both operands with their reduction dimension contiguous
in shared memory. For Q K^T that is the usual layout (D contiguous in both). For P V the
reduction runs over keys, so V must be stored transposed, (batch, kv_heads, D, N) with the
keys contiguous: the caller's layout (``cutile_fmha.to_fp8(value, transpose=True)`` makes it,
in this file's ``quantize`` kernel as it rounds V to float8). The
key loop is step 9's ``attend_query_tile``, whose FP8 constant loads V that way.

Both products accumulate in the tensor cores (``ct.mma(..., use_fast_acc=True)``), as the
bfloat16 ones do and as FlashAttention-3's FP8 forward does. cuTile's default for float8
adds each product to the float32 accumulator in registers instead (more precise sums over
long reductions), which takes a second accumulator: at D=256 a 64 x 256 float32 one per
warpgroup beside acc, so 128-row tiles spilled and the launch fell back to 64-row tiles.
Against float64 on random inputs of up to 16k keys the output's error is unchanged (D=256's
LSE error up to twice); at 128k keys it is up to 7% larger (docs/performance.md, "FP8
forward").

A float8 product takes half as long as a 16-bit one, the softmax's exponentials as long as
ever: at D=128 the multi-function unit's MUFU.EX2 is as busy as the tensor cores. So the
launch may move one exponential in FMA_EXP2 of each unmasked key tile to the FMA pipes
(a quadratic, far more precise than P's e4m3; TunedLaunch.fma_exp2, 0 for none). At D=128
on an H200, 1 in 8 without the mask and 1 in 16 under it run 2-7% faster, without the mask
from 4k keys and under it from 8k; D=64 takes 1 in 16 too, D=256 none.
"""

import cuda.tile as ct

from ..platforms import occupancy_by_target, worker_warps_by_target
from .common import ConstBool, ConstInt, query_tiles_longest_first
from .step9_unmasked_loop import attend_query_tile


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha(Q, K, V, Out, Lse, QDescale, KDescale, VDescale, qk_scale: float, query_offset: int,
         TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool, WRITE_LSE: ConstBool, FMA_EXP2: ConstInt):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:
        q_tile, head, batch = query_tiles_longest_first(K, TILE_D, TILE_D, QUERY_GROUP)
    descale = (batch, head // QUERY_GROUP)
    scores_scale = qk_scale * ct.gather(QDescale, (batch, head)) * ct.gather(KDescale, descale)
    attend_query_tile(Q, K, V, Out, Lse, batch, head, q_tile, scores_scale, query_offset,
                      TILE_D, 0, TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE, True,
                      ct.gather(VDescale, descale), FMA_EXP2, False, 0.0, False, 0, 0, False,
                      Lse)


@ct.kernel
def quantize(X, Descale, Out, TILE_S: ConstInt, TILE_D: ConstInt, TRANSPOSE: ConstBool):
    """TILE_S rows of one head of X (batch, heads, rows, D) divided by that head's Descale
    (float32 (batch, heads)) and rounded to float8_e4m3fn: Out (batch, heads, rows, D), or
    with TRANSPOSE (batch, heads, D, rows rounded up to 16), the layout attention_fp8 takes
    V in, its columns past the last row 0 (X's zero padding: the grid covers them). TILE_D:
    D rounded up to a power of two. One read of X and one write of Out, where the same in
    PyTorch makes two float32 copies of X."""
    tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    x = ct.load(X, index=(batch, head, tile, 0), shape=(1, 1, TILE_S, TILE_D),
                padding_mode=ct.PaddingMode.ZERO).reshape((TILE_S, TILE_D))
    x8 = ct.truediv(x.astype(ct.float32), ct.gather(Descale, (batch, head))).astype(Out.dtype)
    if TRANSPOSE:
        ct.store(Out, index=(batch, head, 0, tile),
                 tile=ct.transpose(x8).reshape((1, 1, TILE_D, TILE_S)))
    else:
        ct.store(Out, index=(batch, head, tile, 0), tile=x8.reshape((1, 1, TILE_S, TILE_D)))
