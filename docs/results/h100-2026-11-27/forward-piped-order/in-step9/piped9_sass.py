import io, re, sys
from collections import Counter
sys.path.insert(0, "/work/main/.scratch/piped9")
import cuda.tile as ct
import piped9
from cutile_fmha.steps.compile import sass, resource_usage, export_cubin
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.family import forward_constants
from cutile_fmha.steps.launcher import with_hints
from cutile_fmha.platforms import TileShape
from cutile_fmha.steps.compile import CT_DTYPES
from cutile_fmha.steps.family import ROWS_MULTIPLE
for d, tm, tn, hints in [(128, 64, 128, {"occupancy": 2, "num_worker_warps": None}),
                         (128, 128, 128, {"occupancy": 1, "num_worker_warps": 8}),
                         (64, 128, 64, {"occupancy": 2, "num_worker_warps": 8})]:
    for piped in (False, True):
        consts = forward_constants(d, TileShape(tm, tn), query_group=1, causal=False, write_lse=False)
        sig = STEPS[9].family.signature(CT_DTYPES["bfloat16"], consts, ROWS_MULTIPLE)
        from cuda.tile.compilation import export_kernel, KernelSignature, CallingConvention
        sig = KernelSignature(list(sig.parameters) + [piped], CallingConvention.cutile_python_v1())
        buf = io.BytesIO()
        export_kernel(with_hints(piped9.fmha, hints), [sig], buf, gpu_code="sm_90", output_format="cubin")
        t = sass(buf.getvalue())
        c = Counter(re.findall(r'\b(HGMMA|WARPGROUP\.DEPBAR\.LE gsb0, 0x\d|MUFU\.EX2|STL|LDL)\b', t))
        print(d, tm, tn, hints, "piped" if piped else "step9-loop", dict(c), resource_usage(buf.getvalue()).strip().splitlines()[-1][:42], flush=True)
