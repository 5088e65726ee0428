"""Paged caches of blocks of 16 and 32 keys: the committed decode kernel (cutile_fmha_old:
the blocks of a key tile joined for S^T = K Q^T) against the query columns on the M side
(cutile_fmha: S = Q K^T and O = P V, one product per block). bf16, 32/8 heads, D=128,
q_len 1, the split rule, CUDA graphs, 5 rotating rounds."""
import statistics, sys, torch, triton.testing as tt
import cutile_fmha as new
import cutile_fmha_old as old
print(torch.cuda.get_device_name(), torch.__version__, flush=True)
H, HKV, D, ROUNDS = 32, 8, 128, 5
shapes = ((1, 1024), (1, 4096), (1, 32768), (4, 4096), (16, 4096), (16, 32768), (64, 4096))
for batch, cache in shapes:
    g = torch.Generator(device="cuda").manual_seed(batch * cache)
    q = torch.randn(batch, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(batch, HKV, cache, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    fns = {"dense": lambda: old.attention_with_kvcache(q, k, v, lens)}
    for bs in (16, 32, 64):
        nb = cache // bs
        table = torch.randperm(batch * nb, device="cuda", generator=g).view(batch, nb).to(torch.int32)
        kp = torch.empty(batch * nb, bs, HKV, D, device="cuda", dtype=torch.bfloat16)
        vp = torch.empty_like(kp)
        for dst, src in ((kp, k), (vp, v)):
            dst[table.flatten().long()] = src.view(batch, HKV, nb, bs, D).permute(0, 2, 3, 1, 4) \
                .reshape(batch * nb, bs, HKV, D)
        for tag, mod in (("old", old), ("new", new)):
            fns[f"paged {bs} {tag}"] = lambda mod=mod, kp=kp, vp=vp, table=table: \
                mod.attention_with_kvcache(q, kp, vp, lens, block_table=table)
    ref = fns["dense"]()
    for bs in (16, 32, 64):
        a, b = fns[f"paged {bs} old"](), fns[f"paged {bs} new"]()
        err_old = (a.float() - ref.float()).abs().max().item()
        err_new = (b.float() - ref.float()).abs().max().item()
        print(f"  bs {bs}: max |paged - dense| old {err_old:.2e} new {err_new:.2e}", flush=True)
        assert err_new < 2e-2, (batch, cache, bs)
    names = list(fns)
    res = {n: [] for n in names}
    for r in range(ROUNDS):
        shift = r % len(names)
        for n in names[shift:] + names[:shift]:
            res[n].append(tt.do_bench_cudagraph(fns[n], rep=100) * 1e3)
    med = {n: statistics.median(t) for n, t in res.items()}
    print(f"batch {batch} x {cache} keys: dense {med['dense']:.2f} us; paged, us (over dense), "
          f"old -> new:", flush=True)
    for bs in (16, 32, 64):
        o, n = med[f"paged {bs} old"], med[f"paged {bs} new"]
        print(f"  blocks of {bs:3d}: {o:8.2f} ({o / med['dense']:.3f}) -> {n:8.2f} "
              f"({n / med['dense']:.3f})   new / old {n / o:.3f}   rounds new/old "
              + " ".join(f"{x / y:.3f}" for x, y in zip(res[f'paged {bs} new'], res[f'paged {bs} old'])),
              flush=True)
