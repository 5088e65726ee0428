"""sm_90 code of this tree against the committed package (cutile_fmha_old): step 9-11 and the
kernels that run step 9's loop, and the decode launches that do not take the new paged path."""
import sys, importlib
sys.path.insert(0, ".scratch/pk")
res = {}
for name in ("cutile_fmha", "cutile_fmha_old"):
    c = importlib.import_module(f"{name}.steps.compile")
    var = importlib.import_module(f"{name}.steps.variants")
    V = var.Variants
    out = []
    for step in (9, 10, 11):
        d = 128 if step == 9 else 320
        out.append(c.compile_step(step, "sm_90", dtype="float16", head_dim=d, causal=True))
    out.append(c.compile_varlen("fmha", "sm_90", dtype="bfloat16", head_dim=128, causal=True))
    out.append(c.compile_varlen("fmha", "sm_90", dtype="bfloat16", head_dim=96, causal=False))
    out.append(c.compile_fp8("sm_90", head_dim=128, causal=True))
    out.append(c.compile_variants("sm_90", dtype="bfloat16", head_dim=128, causal=True,
                                  variants=V(window=(256, 0), softcap=30.0, sinks=True)))
    out.append(c.compile_variants("sm_90", dtype="bfloat16", head_dim=192, causal=True,
                                  variants=V(softcap=30.0), value_head_dim=128))
    for kw in [dict(head_dim=128, q_len=1), dict(head_dim=128, q_len=4, splits=4, has_starts=True, causal=True),
               dict(head_dim=256, q_len=1, block_size=64, splits=4),
               dict(head_dim=128, q_len=1, block_size=16, splits=4),
               dict(head_dim=128, q_len=8, block_size=16, splits=2, causal=True),
               dict(head_dim=64, q_len=8, block_size=32, causal=True),
               dict(head_dim=128, q_len=32, block_size=16, causal=True, has_starts=True),
               dict(head_dim=128, q_len=16, block_size=64, splits=4, causal=True, has_starts=True),
               dict(head_dim=128, q_len=2, causal=True, variants=V(window=(64, 0), softcap=30.0, sinks=True)),
               dict(head_dim=128, q_len=16, splits=4, causal=True, write_lse=True),
               dict(head_dim=64, q_len=32, causal=True, variants=V(window=(64, 0), softcap=30.0, sinks=True)),
               dict(head_dim=256, q_len=32, splits=2, causal=True, has_starts=True)]:
        out.append(c.compile_decode("sm_90", dtype="bfloat16", **kw)[0])
    res[name] = [c.sass(x) for x in out]
print([a == b for a, b in zip(res["cutile_fmha"], res["cutile_fmha_old"])])
