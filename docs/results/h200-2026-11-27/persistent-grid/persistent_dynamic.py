"""Probe: step 9 on a persistent grid whose CTAs take their next query tile from a counter
(an atomic add), in step 9's tile order (tile_major's L2 groups, longest first under the
causal mask), against step 9's grid and cuDNN in rotating rounds of CUDA-graph replays.
persistent_order.py's fixed assignment let the CTAs drift apart under the causal mask
(L2 hit rate 85% -> 49%): taken from a counter, the tiles in flight stay next to each
other in that order, as the hardware's dispatch of step 9's grid keeps them. The counter
is zeroed before each launch (a memset in the timed graph)."""
import sys
from pathlib import Path

import cuda.tile as ct
import torch

sys.path.insert(0, str(Path(__file__).parent))
from persistent_order import CASES, attend_tile, compare, l2_group  # noqa: E402
from cutile_fmha.kernels.common import ConstBool, ConstInt  # noqa: E402
from cutile_fmha.steps.launcher import current_stream  # noqa: E402


@ct.kernel
def persistent(Q, K, V, Out, Lse, Counter, qk_scale: float, query_offset: int,
               TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
               CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    tiles = ct.cdiv(Q.shape[2], TILE_M)
    pairs = Q.shape[1] * Q.shape[0]
    group = l2_group(K, tiles, pairs, TILE_D, QUERY_GROUP, CAUSAL)
    t = ct.bid(0)  # the first tiles by the CTA's index, the next ones from the counter
    while t < tiles * pairs:
        attend_tile(Q, K, V, Out, Lse, t, tiles, pairs, group, qk_scale, query_offset, TILE_D,
                    TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE)
        t = ct.atomic_add(Counter, 0, 1) + ct.num_blocks(0)


def from_a_counter(q, k, v, out, plan, hints, sms):
    """The counter kernel's launches, one and (where the hint asks) two CTAs per SM, each
    zeroing the counter first."""
    kernel = persistent.replace_hints(**{a: b for a, b in hints.items() if b is not None})
    counter = torch.zeros(1, dtype=torch.int32, device=q.device)
    args = (q, k, v, out, plan.args[4], counter) + plan.args[5:]

    def launch(grid):
        counter.zero_()
        ct.launch(current_stream(q.device), grid, kernel, args)
    return {f"counter {per_sm}/SM": lambda grid=(sms * per_sm, 1, 1): launch(grid)
            for per_sm in sorted({1, hints.get("occupancy") or 1})}


if __name__ == "__main__":
    compare(from_a_counter, [case for case in CASES if case[0] != 64],
            int(sys.argv[1]) if len(sys.argv) > 1 else 5)
