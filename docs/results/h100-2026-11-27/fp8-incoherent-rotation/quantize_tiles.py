"""to_fp8's kernel at other tile sizes (elements per CTA), and its two parts' times: the
per-head maximum (torch.linalg.vector_norm) and the quantization kernel; bf16, B=4, H=32,
N=8192, D=128; triton's do_bench."""
import json, math, torch, triton.testing as tt
import cutile_fmha.steps.fp8 as f
from cutile_fmha import to_fp8

x = torch.randn(4, 32, 8192, 128, device="cuda", dtype=torch.bfloat16)
amax = torch.linalg.vector_norm(x, math.inf, dim=(2, 3)).float()
descale = amax / 448
print(json.dumps({"vector_norm ms": tt.do_bench(lambda: torch.linalg.vector_norm(x, math.inf, dim=(2, 3)), rep=200)}))
reference = {t: to_fp8(x, transpose=t)[0].view(torch.uint8) for t in (False, True)}
for elements in (4096, 8192, 16384, 32768):
    f.QUANTIZE_TILE_ELEMENTS = elements
    for transpose in (False, True):
        out = torch.empty(reference[transpose].shape, dtype=torch.float8_e4m3fn, device="cuda")
        run = lambda: f.quantize_fp8(x, descale, out, transpose=transpose)  # noqa: E731
        run()
        ms = tt.do_bench(run, rep=200)
        print(json.dumps({"elements": elements, "transpose": transpose, "kernel ms": ms,
                          "GB/s (read + write)": (x.numel() * 3) / ms / 1e6,
                          "same bits": torch.equal(out.view(torch.uint8), reference[transpose])}), flush=True)
