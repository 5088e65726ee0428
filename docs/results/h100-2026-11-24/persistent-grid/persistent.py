"""Probe: step 9 on a persistent grid (one CTA per SM and occupancy slot, each looping over
query tiles; causal: the last query tiles first) against step 9's grid, in rotating rounds."""
import sys, statistics
import cuda.tile as ct
from cutile_fmha.kernels.step9_unmasked_loop import attend_query_tile
from cutile_fmha.kernels.common import ConstInt, ConstBool


@ct.kernel
def fmha_persistent(Q, K, V, Out, Lse, qk_scale: float, query_offset: int,
                    TILE_D: ConstInt, TILE_M: ConstInt, TILE_N: ConstInt, QUERY_GROUP: ConstInt,
                    CAUSAL: ConstBool, WRITE_LSE: ConstBool):
    heads = Q.shape[1]
    q_tiles = ct.cdiv(Q.shape[2], TILE_M)
    pairs = heads * Q.shape[0]
    for t in range(ct.bid(0), q_tiles * pairs, ct.num_blocks(0)):
        if CAUSAL:  # the last query tiles (the most keys) first, every head of one at once
            q_tile = q_tiles - 1 - t // pairs
            pair = t % pairs
        else:  # neighbouring CTAs on one head: its K/V stays in L2
            q_tile = t % q_tiles
            pair = t // q_tiles
        attend_query_tile(Q, K, V, Out, Lse, pair // heads, pair % heads, q_tile, qk_scale,
                          query_offset, TILE_D, 0, TILE_D, TILE_M, TILE_N, QUERY_GROUP, CAUSAL,
                          WRITE_LSE, False, 1.0, False, 0.0, False, 0, 0, False, Lse)


def main():
    import torch, triton.testing as tt
    from cutile_fmha.steps.launcher import build_plan, STEPS, current_stream
    from cutile_fmha.platforms import entry_for
    from cutile_fmha import attention
    from torch.nn.attention import sdpa_kernel, SDPBackend
    print(torch.cuda.get_device_name(), flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    entry = entry_for("sm_90")
    for D, N, causal in ((128, 4096, True), (128, 16384, True), (128, 4096, False), (128, 16384, False), (64, 4096, True), (256, 4096, True)):
        B, H = 4, 32 if D < 256 else 16
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        plan = build_plan(q, k, v, causal=causal, scale=None, step=9, platform=None, out=None, with_lse=False)
        tiles, hints = STEPS[9].launch_config(entry, native=True, head_dim=D, causal=causal)
        occupancy = (hints or {}).get("occupancy") or 1
        kernel = fmha_persistent.replace_hints(**hints) if hints else fmha_persistent
        out = torch.full_like(q, float("nan"))
        args = (q, k, v, out) + plan.args[4:]
        grid = (sms * occupancy, 1, 1)
        launch = lambda: ct.launch(current_stream(q.device), grid, kernel, args)
        launch(); torch.cuda.synchronize()
        ref = plan.launch().clone()
        err = (out.float() - ref.float()).abs().max().item()
        fns = {"step 9": plan.launch, "persistent": launch}
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns["cudnn"] = cudnn
        res = {n: [] for n in fns}
        names = list(fns)
        for r in range(3):
            for n in names[r % 3:] + names[:r % 3]:
                res[n].append(tt.do_bench_cudagraph(fns[n], rep=200))
        med = {n: statistics.median(x) for n, x in res.items()}
        flops = 4 * B * H * N * N * D / (2 if causal else 1)
        print(f"D={D} N={N} {'causal' if causal else 'non-causal'} tiles {tiles} hints {hints} grid {grid}: max diff to step 9 {err:.3g}; " +
              "; ".join(f"{n} {med[n]:.3f} ms {flops / med[n] / 1e9:.0f} TFLOPS" for n in fns) +
              f"; persistent/step9 {med['persistent'] / med['step 9']:.3f}", flush=True)


if __name__ == "__main__":
    main()
