"""The window probe's forms compiled for sm_90 (bf16, D=128, 32/8 heads, window 4096,
causal), beside the committed window kernel: registers, stack, shared memory, products."""
import io, re, sys
sys.path.insert(0, "docs/results/h100-2026-11-27/window-lower-edge")
from window_probe import fmha_probe
from cuda.tile.compilation import export_kernel, KernelSignature, CallingConvention
from cutile_fmha.steps.family import FORWARD_VARIANTS
from cutile_fmha.steps.compile import CT_DTYPES, sass, resource_usage, compile_variants
from cutile_fmha.steps.variants import Variants, variants_kernel
from cutile_fmha.platforms import entry_for

variants = Variants(window=(4096, 0))
_, c = variants_kernel(entry_for("sm_90"), head_dim=128, causal=True, query_group=4,
                       write_lse=False, variants=variants)
def report(name, cub):
    s = sass(cub)
    counts = {k: len(re.findall(re.escape(k), s)) for k in ("HGMMA", "WARPGROUP.DEPBAR", "UTMALDG", "BAR.SYNC")}
    print(name, resource_usage(cub).split(" CONST")[0], counts, flush=True)
report("committed", compile_variants("sm_90", dtype="bfloat16", head_dim=128, causal=True,
                                     query_group=4, variants=variants))
base = FORWARD_VARIANTS.signature(CT_DTYPES["bfloat16"], c, 16)
for form in range(4):
    sig = KernelSignature(list(base.parameters) + [form], CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    export_kernel(fmha_probe, [sig], buf, gpu_code="sm_90", output_format="cubin")
    report(f"form {form}", buf.getvalue())
