"""Probe: step 9 on a persistent grid (one CTA per SM and occupancy slot, each taking every
G-th query tile) in step 9's own tile order (tile_major's L2 groups, longest first under
the causal mask), against step 9's grid and cuDNN in rotating rounds of CUDA-graph replays.
The 2026-11-24 probe ran every head at once under the causal mask (K/V of 128 heads in
flight); this one keeps the order the hardware's dispatch of step 9's grid gives."""
import statistics
import sys

import cuda.tile as ct
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from cutile_fmha.kernels.common import (L2_GROUP_BYTES, MIN_GROUP_CTAS, ConstBool, ConstInt,
                                        kv_pair_bytes)
from cutile_fmha.kernels.step9_unmasked_loop import attend_query_tile
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.launcher import build_plan, current_stream


def l2_group(K, tiles, pairs, TILE_D: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool):
    """How many (head, batch) pairs step 9's grid takes together: tile_major's L2 groups
    under the causal mask, all of them without."""
    group = pairs
    if CAUSAL:
        group = min(max(L2_GROUP_BYTES // max(kv_pair_bytes(K.shape[2], 2 * TILE_D, QUERY_GROUP), 1),
                        ct.cdiv(MIN_GROUP_CTAS, tiles)), pairs)
    return group


def attend_tile(Q, K, V, Out, Lse, t, tiles, pairs, group, qk_scale, query_offset,
                TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
                CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    """Step 9's query tile number t in step 9's order: tile_major's, the last query tiles
    first, under the causal mask; x (the query tile) fastest without."""
    if CAUSAL:
        first_pair = t // (group * tiles) * group
        in_group = min(group, pairs - first_pair)
        rest = t - first_pair * tiles
        pair = first_pair + rest % in_group
        q_tile = tiles - 1 - rest // in_group
    else:
        q_tile = t % tiles
        pair = t // tiles
    heads = Q.shape[1]
    attend_query_tile(Q, K, V, Out, Lse, pair // heads, pair % heads, q_tile, qk_scale,
                      query_offset, TILE_D, 0, TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL,
                      WRITE_LSE, False, 1.0, False, 0.0, False, 0, 0, False, Lse)


@ct.kernel
def persistent(Q, K, V, Out, Lse, qk_scale: float, query_offset: int,
               TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
               CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    tiles = ct.cdiv(Q.shape[2], TILE_M)
    pairs = Q.shape[1] * Q.shape[0]
    group = l2_group(K, tiles, pairs, TILE_D, QUERY_GROUP, CAUSAL)
    for t in range(ct.bid(0), tiles * pairs, ct.num_blocks(0)):
        attend_tile(Q, K, V, Out, Lse, t, tiles, pairs, group, qk_scale, query_offset, TILE_D,
                    TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE)


CASES = [(128, 4096, True, 4, 32), (128, 8192, True, 4, 32), (128, 16384, True, 1, 32),
         (128, 2048, True, 4, 16), (64, 8192, True, 4, 32), (256, 8192, True, 4, 16),
         (128, 8192, False, 4, 32)]  # D, N, causal, B, H


def fixed_assignment(q, k, v, out, plan, hints, sms):
    """The persistent kernel's launches, one and (where the hint asks) two CTAs per SM."""
    kernel = persistent.replace_hints(**{a: b for a, b in hints.items() if b is not None})
    args = (q, k, v, out) + plan.args[4:]
    return {f"persistent {per_sm}/SM":
            lambda grid=(sms * per_sm, 1, 1): ct.launch(current_stream(q.device), grid, kernel, args)
            for per_sm in sorted({1, hints.get("occupancy") or 1})}  # the hint may ask for more than fits


def compare(launches_of, cases, rounds):
    """Each case's launches from launches_of(q, k, v, out, plan, hints, sms) against step 9's
    grid and cuDNN: equal to step 9 bit for bit, and times in rotating rounds."""
    import triton.testing as tt
    print(torch.cuda.get_device_name(), flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    entry = entry_for("sm_90")
    for D, N, causal, B, H in cases:
        g = torch.Generator(device="cuda").manual_seed(D + N)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(3))
        plan = build_plan(q, k, v, causal=causal, scale=None, step=9, platform=None, out=None,
                          with_lse=False)
        tiles, hints = STEPS[9].launch_config(entry, native=True, head_dim=D, causal=causal)
        out = torch.full_like(q, float("nan"))
        fns = launches_of(q, k, v, out, plan, hints, sms)
        tried = list(fns)
        fns["step 9"] = plan.launch

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["cudnn"] = cudnn
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        ref = plan.launch().clone()
        same = []
        for name in tried:
            out.fill_(float("nan"))
            fns[name]()
            torch.cuda.synchronize()
            same.append(torch.equal(out, ref))
        res = {n: [] for n in fns}
        names = list(fns)
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                res[n].append(tt.do_bench_cudagraph(fns[n], rep=200))
        med = {n: statistics.median(x) for n, x in res.items()}
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        print(f"D={D} B={B} H={H} N={N} {'causal' if causal else 'non-causal'} tiles {tiles} "
              f"hints {hints}: equal to step 9 {same}; "
              + "; ".join(f"{n} {med[n]:.3f} ms ({min(res[n]):.3f}-{max(res[n]):.3f}) "
                          f"{flops / med[n] / 1e9:.0f} TFLOPS" for n in fns)
              + "; " + ", ".join(f"{n} / step 9 {med[n] / med['step 9']:.3f}" for n in tried)
              + f", cuDNN / step 9 {med['cudnn'] / med['step 9']:.3f}", flush=True)


def main():
    compare(fixed_assignment, CASES, int(sys.argv[1]) if len(sys.argv) > 1 else 5)


if __name__ == "__main__":
    main()
