"""The one-kernel backward's small kernels before dK/dV: Delta = rowsum(O * dO) (row_dot)
and the float32 dQ's zeros (torch.zeros), against row_dot on other query tiles and one
probe kernel that also writes the zeros. bf16, D=128, CUDA-graph replays in rotating
rounds; the Delta of every form is compared with row_dot's."""
import statistics

import cuda.tile as ct
import torch
import triton.testing

from cutile_fmha.kernels import backward as kernels
from cutile_fmha.kernels.common import ConstInt

ZERO = ct.PaddingMode.ZERO


@ct.kernel
def row_dot_and_zeros(Out, dOut, Delta, DQAcc, TILE_M: ConstInt, TILE_D: ConstInt):
    q_tile, head, batch = ct.bid(0), ct.bid(1), ct.bid(2)
    o = kernels.load_query_tile(Out, batch, head, q_tile, TILE_M, TILE_D).astype(ct.float32)
    do = kernels.load_query_tile(dOut, batch, head, q_tile, TILE_M, TILE_D).astype(ct.float32)
    ct.store(Delta, index=(batch, head, q_tile),
             tile=ct.sum(o * do, axis=-1).reshape((1, 1, TILE_M)))
    ct.store(DQAcc, index=(batch, head, q_tile, 0),
             tile=ct.full((1, 1, TILE_M, TILE_D), 0.0, dtype=ct.float32))


def main():
    print(torch.cuda.get_device_name(), flush=True)
    stream = lambda: torch.cuda.current_stream()  # noqa: E731
    for b, h, n in ((4, 32, 4096), (4, 16, 2048), (1, 32, 16384)):
        out, do = (torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16)
                   for _ in range(2))
        delta = torch.empty(b, h, n, device="cuda")
        acc = torch.empty(b, h, n, 128, device="cuda")

        def row_dot(tile_m):
            grid = (-(-n // tile_m), h, b)
            return lambda: ct.launch(stream(), grid, kernels.row_dot,
                                     (out, do, delta, tile_m, 128))

        def fused(tile_m):
            grid = (-(-n // tile_m), h, b)
            return lambda: ct.launch(stream(), grid, row_dot_and_zeros,
                                     (out, do, delta, acc, tile_m, 128))

        def package():
            row_dot(64)()
            torch.zeros_like(out, dtype=torch.float32)

        forms = {"row_dot 64 + zeros (package)": package, "row_dot 64": row_dot(64),
                 "row_dot 128": row_dot(128), "row_dot 256": row_dot(256),
                 "fused 64": fused(64), "fused 128": fused(128)}
        row_dot(64)()
        want = delta.clone()
        for name, fn in forms.items():
            delta.fill_(float("nan"))
            acc.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            same = torch.equal(delta, want)
            zeros = "fused" not in name or bool((acc == 0).all())
            print(f"  {name}: Delta equal to row_dot 64's: {same}; zeros written: {zeros}")
        times = {name: [] for name in forms}
        names = list(forms)
        for r in range(7):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(triton.testing.do_bench_cudagraph(forms[name], rep=50))
        gb = 2 * out.numel() * 2 / 1e9
        print(f"B={b} H={h} N={n}: " + ", ".join(
            f"{name} {1000 * statistics.median(t):.1f} us" for name, t in times.items())
            + f"; row_dot reads {gb:.3f} GB, the zeros write {2 * gb:.3f} GB", flush=True)


main()
