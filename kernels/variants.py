"""The attention variants today's checkpoints use, on step 9's loop: sliding window, logit
softcap and attention sinks, each a compile-time constant (off: the code is not there).

- Sliding window (Mistral, Gemma 2/3, Qwen): query row i sees the keys within window_left
  before and window_right after its diagonal key i + query_offset (flash-attn's
  window_size, aligned as the causal mask is). The key loop starts at the first tile the
  query tile's window reaches and stops after the last, so a sequence of N keys with a
  window of w costs O(N w), not O(N^2); only the tiles across the window's edges are
  masked.
- Logit softcap (Gemma 2): scores softcap * tanh(scale * q.k / softcap) before the
  softmax. The tanh is taken on the raw product times scale / softcap, and softcap
  becomes the factor the softmax's base-2 exponent scales by, so the cap costs one
  multiply and one MUFU.TANH per score.
- Attention sinks (gpt-oss, StreamingLLM): one learnable logit per query head that joins
  every row's softmax denominator and adds no value. The running max and sum start from
  it, as if it were a key seen before the first: nothing more per key tile.

The key loop is step 9's ``attend_query_tile``; this kernel only passes its constants.
"""

import cuda.tile as ct

from ..platforms import occupancy_by_target, worker_warps_by_target
from .common import ConstBool, ConstInt, query_tiles_longest_first
from .step9_unmasked_loop import attend_query_tile


@ct.kernel(occupancy=occupancy_by_target(), num_worker_warps=worker_warps_by_target())
def fmha(Q, K, V, Out, Lse, Sinks, qk_scale: float, query_offset: int, softcap: float,
         window_left: int, window_right: int, TILE_D: ConstInt, TILE_D_TAIL: ConstInt,
         TILE_DV: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
         CAUSAL: ConstBool, WRITE_LSE: ConstBool, SOFTCAP: ConstBool, WINDOW: ConstBool,
         SINKS: ConstBool):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    if CAUSAL:
        q_tile, head, batch = query_tiles_longest_first(K, TILE_D + TILE_D_TAIL, TILE_DV,
                                                        QUERY_GROUP)
    attend_query_tile(Q, K, V, Out, Lse, batch, head, q_tile, qk_scale, query_offset, TILE_D,
                      TILE_D_TAIL, TILE_DV, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE, False,
                      1.0, 0, SOFTCAP, softcap, WINDOW, window_left, window_right, SINKS, Sinks)
