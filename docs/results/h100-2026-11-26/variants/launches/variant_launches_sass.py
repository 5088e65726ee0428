"""Compile-only: the window/softcap kernels at the candidate launches: registers, stack, HGMMA, waits, MUFU."""
import re, subprocess, sys, tempfile, os
sys.path.insert(0, os.path.dirname(__file__))
from variant_launches import LAUNCHES, entry_with
from cutile_fmha.steps.compile import compile_variants
from cutile_fmha.steps.variants import Variants
cases = {"window causal": (True, Variants(window=(4096, 0))),
         "softcap causal": (True, Variants(softcap=30.0)),
         "softcap non-causal": (False, Variants(softcap=30.0))}
for name, (causal, var) in cases.items():
    for launch in LAUNCHES:
        try:
            cubin = compile_variants("sm_90", dtype="bfloat16", head_dim=128, causal=causal,
                                     variants=var, query_group=4 if "window" in name else 1,
                                     entry=entry_with(launch, causal))
        except Exception as e:
            print(name, launch, "ERR", str(e).splitlines()[0][:100]); continue
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin); f.flush()
            res = subprocess.run(["cuobjdump", "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
            sass = subprocess.run(["cuobjdump", "--dump-sass", f.name], capture_output=True, text=True).stdout
        reg = re.search(r"REG:(\d+)", res).group(1); stack = re.search(r"STACK:(\d+)", res).group(1)
        shared = re.search(r"SHARED:(\d+)", res).group(1)
        print(f"{name:20s} {str(launch):22s} REG {reg} STACK {stack} SHARED {int(shared)//1024}K "
              f"HGMMA {sass.count('HGMMA')} DEPBAR {sass.count('WARPGROUP.DEPBAR')} TANH {sass.count('MUFU.TANH')} EX2 {sass.count('MUFU.EX2')}")
