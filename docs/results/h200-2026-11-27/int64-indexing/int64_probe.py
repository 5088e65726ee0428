"""Step 9 at D=128 (sm_90, bf16, with the LSE) compiled with 64-bit array indexing (the
signature's index_dtype int64 on Q, K, V, Out and Lse; step 9's own kernel, whose arrays
the signature types) against the package's 32-bit one: resource usage and the
instructions that tell (compile-only; the tileiras the cuda-tile package finds).
Run: python int64_probe.py"""
import io, re, collections, dataclasses
import cuda.tile as ct
from cuda.tile.compilation import export_kernel, ArrayConstraint, KernelSignature
from cutile_fmha.steps import compile as C
from cutile_fmha.steps.definitions import STEPS
from cutile_fmha.steps.family import forward_constants, FORWARD
from cutile_fmha.steps.compile import sass, resource_usage

for causal in (True, False):
    tiles, hints = STEPS[9].launch_config(C.entry_for("sm_90"), native=True, head_dim=128, causal=causal)
    constants = forward_constants(128, tiles, query_group=1, causal=causal, write_lse=True)
    base = FORWARD.signature(ct.bfloat16, constants)
    params64 = [dataclasses.replace(p, index_dtype=ct.int64)
                if isinstance(p, ArrayConstraint) else p for p in base.parameters]
    for label, sig in (("int32", base), ("int64", KernelSignature(params64, base.calling_convention))):
        buf = io.BytesIO()
        try:
            export_kernel(C.kernel_for(9, hints), [sig], buf, gpu_code="sm_90", output_format="cubin")
        except Exception as e:
            print(label, "error", str(e)[:300]); continue
        cub = buf.getvalue(); code = sass(cub)
        c = collections.Counter(re.findall(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", code))
        print("causal" if causal else "full", label, re.search(r"REG:\d+ STACK:\d+ SHARED:\d+", resource_usage(cub))[0],
              "instructions", sum(c.values()), "HGMMA", sum(v for k, v in c.items() if k.startswith("HGMMA")),
              "DEPBAR", c["WARPGROUP.DEPBAR.LE"], "UTMALDG", sum(v for k, v in c.items() if k.startswith("UTMALDG")),
              "IMAD.WIDE", sum(v for k, v in c.items() if k.startswith("IMAD.WIDE")),
              "LDGSTS", sum(v for k, v in c.items() if k.startswith("LDGSTS")),
              "LDG", sum(v for k, v in c.items() if k.startswith("LDG.")))
