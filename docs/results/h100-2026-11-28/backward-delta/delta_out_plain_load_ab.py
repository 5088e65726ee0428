"""The dQ kernel's O tile (DELTA_FROM_OUT) loaded by TMA (the package: 32 KB more shared
memory) against plain loads (a copy of kernels/backward.py with allow_tma=False on that
load: the shared memory of the kernel without it), and the two kernels after row_dot; bf16,
D=128, causal, 5 rotating rounds of CUDA-graph replays, one process."""
import importlib.util
import pathlib
import statistics
import tempfile

import torch
import triton.testing

from cutile_fmha import attention_with_lse
from cutile_fmha.kernels import backward as package_kernels
from cutile_fmha.steps.backward import (BACKWARD_FAMILIES, attention_backward,
                                        launch_gradient_kernels, row_dot)

OLD = "        o = load_query_tile(Out, batch, head, q_tile, TILE_M, TILE_DV).astype(ct.float32)\n"
NEW = ("        o = ct.load(Out, index=(batch, head, q_tile, 0), shape=(1, 1, TILE_M, TILE_DV),\n"
       "                    padding_mode=ZERO, allow_tma=False).reshape((TILE_M, TILE_DV))"
       ".astype(ct.float32)\n")


def plain_load_module():
    source = pathlib.Path(package_kernels.__file__).read_text()
    assert OLD in source
    source = source.replace(OLD, NEW).replace("from .", "from cutile_fmha.kernels.")
    path = pathlib.Path(tempfile.mkdtemp()) / "backward_plain_out.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    plain = plain_load_module()
    print(torch.cuda.get_device_name(), flush=True)
    for b, h, hkv, n in ((4, 16, 4, 2048), (8, 32, 8, 1024), (4, 32, 8, 4096), (2, 32, 8, 8192)):
        gen = torch.Generator(device="cuda").manual_seed(n + h)
        q = torch.randn(b, h, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
        k, v = (torch.randn(b, hkv, n, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
                for _ in range(2))
        out, lse = attention_with_lse(q, k, v, is_causal=True, enable_gqa=True)
        do = torch.randn_like(out)

        def plain_loads():
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            launch_gradient_kernels(BACKWARD_FAMILIES, {
                "Q": q, "K": k, "V": v, "dO": do, "Lse": lse, "Out": out, "Delta": None,
                "dK": dk, "dV": dv, "dQ": dq, "qk_scale": 128 ** -0.5, "query_offset": 0},
                causal=True, module=plain)
            return dq, dk, dv

        forms = {"row_dot": lambda: attention_backward(q, k, v, out, lse, do, causal=True,
                                                       delta=row_dot(out, do)),
                 "O by TMA": lambda: attention_backward(q, k, v, out, lse, do, causal=True),
                 "O by plain loads": plain_loads}
        grads = {name: fn() for name, fn in forms.items()}
        same = all(torch.equal(x, y) for x, y in zip(grads["O by TMA"], grads["O by plain loads"]))
        times = {name: [] for name in forms}
        names = list(forms)
        for r in range(5):
            for name in names[r % 3:] + names[:r % 3]:
                times[name].append(triton.testing.do_bench_cudagraph(forms[name], rep=100))
        med = {name: statistics.median(t) for name, t in times.items()}
        print(f"B={b} H={h}/{hkv} N={n} causal: " + ", ".join(
            f"{name} {med[name]:.4f} ms ({min(times[name]):.4f}-{max(times[name]):.4f})"
            for name in names) + f"; plain / TMA {med['O by plain loads'] / med['O by TMA']:.3f}"
            f", TMA / row_dot {med['O by TMA'] / med['row_dot']:.3f}; gradients of the two "
            f"loads equal: {same}", flush=True)


main()
