"""Two query tiles per CTA against step 9's one. Causal: the (T-1-p)-th and the p-th query
tile of one head, so that every CTA does the same T+1 key tiles and there are half as many
CTAs (with T odd the middle CTA runs its one tile); without the mask: tiles p and
p + ceil(T/2). Step 9's own query-tile code (attend_query_tile) at the table's launch;
against step 9's grid (one query tile a CTA, longest first under the mask) and cuDNN.
CUDA graphs, rotating rounds; outputs (and LSE) compared with step 9's."""
import os, statistics, sys
import torch, triton.testing as tt
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
import cuda.tile as ct
from cutile_fmha import attention, attention_with_lse
from cutile_fmha.kernels.common import ConstBool, ConstInt
from cutile_fmha.kernels.step9_unmasked_loop import attend_query_tile
from cutile_fmha.platforms import entry_for
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.launcher import with_hints

ROUNDS = int(os.environ.get("ROUNDS", "5"))


@ct.kernel
def paired(Q, K, V, Out, Lse, qk_scale: float, query_offset: int, TILE_D: ConstInt,
           TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt, CAUSAL: ConstBool,
           WRITE_LSE: ConstBool):
    pair, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    tiles = ct.cdiv(Q.shape[2], TILE_M)
    args = (TILE_D, 0, TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL, WRITE_LSE, False, 1.0,
            False, 0.0, False, 0, 0, False, Lse)
    first, second = pair, pair + ct.num_blocks(0)
    if CAUSAL:
        first, second = tiles - 1 - pair, pair
    attend_query_tile(Q, K, V, Out, Lse, batch, head, first, qk_scale, query_offset, *args)
    has_second = second < tiles
    if CAUSAL:
        has_second = second < first
    if has_second:
        attend_query_tile(Q, K, V, Out, Lse, batch, head, second, qk_scale, query_offset, *args)


print(torch.cuda.get_device_name(), flush=True)
ENTRY = entry_for("sm_90")
SHAPES = [  # (B, H, HKV, N, D, causal, lse)
    (16, 32, 8, 1024, 128, True, False), (4, 32, 8, 2048, 128, True, True),
    (4, 32, 32, 4096, 128, True, False), (4, 32, 32, 8192, 128, True, False),
    (1, 32, 32, 16384, 128, True, False), (2, 32, 8, 1000, 128, True, False),
    (3, 32, 8, 1152, 128, True, True),
    (16, 32, 8, 1024, 64, True, False), (4, 32, 32, 4096, 64, True, False), (4, 32, 32, 16384, 64, True, False),
    (8, 16, 16, 1024, 256, True, False), (4, 16, 16, 4096, 256, True, False), (2, 16, 16, 16384, 256, True, False),
    (16, 32, 8, 1024, 128, False, False), (4, 32, 32, 4096, 128, False, False), (4, 32, 8, 2048, 64, False, False),
]
if len(sys.argv) > 1:
    SHAPES = [s for s in SHAPES if str(s[4]) in sys.argv[1:]]
for B, H, HKV, N, D, causal, lse in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(N + B + H + D)
    q = torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, HKV, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    scale = D ** -0.5
    tiles, hints = STEPS[9].launch_config(ENTRY, native=True, head_dim=D, causal=causal)
    kernel = with_hints(paired, {k_: v_ for k_, v_ in hints.items() if v_ is not None})
    T = -(-N // tiles.tile_m)
    pairs = -(-T // 2)

    def ours():
        if lse:
            return attention_with_lse(q, k, v, is_causal=causal, enable_gqa=HKV != H)
        return attention(q, k, v, is_causal=causal, enable_gqa=HKV != H)

    def two_tiles():
        out = torch.empty_like(q)
        lse_t = torch.empty(B, H, N, device="cuda", dtype=torch.float32) if lse else out
        ct.launch(torch.cuda.current_stream(), (pairs, H, B), kernel,
                  (q, k, v, out, lse_t, scale, 0, D, tiles.tile_m, tiles.tile_n, H // HKV, causal, lse))
        return (out, lse_t) if lse else out

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=HKV != H)
    fns = {"step 9": ours, "two tiles": two_tiles, "cuDNN": cudnn}
    a, b = ours(), two_tiles()
    same = torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) if lse else torch.equal(a, b)
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            res[n].append(tt.do_bench_cudagraph(fns[n], rep=100) * 1e3)
    med = {n: statistics.median(t) for n, t in res.items()}
    flops = 4 * B * H * N * N * D / (2 if causal else 1)
    print(f"D={D} B={B} H={H}/{HKV} N={N} {'causal' if causal else 'non-causal'}{' +lse' if lse else ''} "
          f"tiles {tiles.tile_m}x{tiles.tile_n} {hints}: same as step 9: {same}; " + "  ".join(
              f"{n} {med[n]:.1f} us ({flops / med[n] / 1e6:.0f} TF, /step9 {med[n] / med['step 9']:.3f})"
              for n in names), flush=True)
