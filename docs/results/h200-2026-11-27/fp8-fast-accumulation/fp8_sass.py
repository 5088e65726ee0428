"""Compile-only: the FP8 forward's sm_90 code at several launches (eight worker warps, one
CTA per SM), for the package named on the command line (cutile_fmha, or a copy of it at
another commit). Per launch: registers, stack frame (spills), local stores and loads,
float8 warpgroup products (QGMMA), how many of them start from a zero accumulator
("RZ, !UPT": the first of a chain), and the waits on them."""
import dataclasses, importlib, json, re, sys

package = sys.argv[1]
entry_for = importlib.import_module(f"{package}.platforms").entry_for
entry = importlib.import_module(f"{package}.platforms.entry")
compile_mod = importlib.import_module(f"{package}.steps.compile")

for head_dim in (128, 256):
    for causal in (False, True):
        for tile_m, tile_n in ((128, 256), (128, 128), (128, 64), (64, 256)):
            base = entry_for("sm_90")
            launch = entry.TunedLaunch(9, entry.TileShape(tile_m, tile_n), 1, 8)
            platform = dataclasses.replace(
                base, fp8_tuned={**base.fp8_tuned, (head_dim, causal): launch})
            cubin = compile_mod.compile_fp8("sm_90", head_dim=head_dim, causal=causal,
                                            entry=platform)
            sass = compile_mod.sass(cubin)
            usage = compile_mod.resource_usage(cubin)
            print(json.dumps({
                "package": package, "head_dim": head_dim, "causal": causal,
                "tiles": f"{tile_m}x{tile_n}",
                "registers": int(re.search(r"REG:(\d+)", usage).group(1)),
                "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
                "STL": len(re.findall(r"\bSTL\b", sass)), "LDL": len(re.findall(r"\bLDL\b", sass)),
                "QGMMA": len(re.findall(r"\bQGMMA\.", sass)),
                "QGMMA from zero": len(re.findall(r"QGMMA\.[^;]*RZ, !UPT", sass)),
                "waits": len(re.findall(r"WARPGROUP\.DEPBAR", sass))}), flush=True)
