"""Paged (block sizes 16/64/256) against dense decode at batch 1, num_splits forced: is the
paged cache's gap at batch 1 the split count's? bf16, 32/8 heads, D=128, q_len 1, CUDA graphs."""
import statistics, torch, triton.testing as tt
from cutile_fmha import attention_with_kvcache
print(torch.cuda.get_device_name(), flush=True)
H, HKV, D = 32, 8, 128
for batch, cache in ((1, 4096), (1, 32768), (16, 4096)):
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(batch, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(batch, HKV, cache, D, device="cuda", dtype=torch.bfloat16, generator=g); v = torch.randn_like(k)
    lens = torch.full((batch,), cache, dtype=torch.int32, device="cuda")
    layouts = {"dense": (k, v, None)}
    for bs in (16, 64, 256):
        nb = cache // bs
        perm = torch.randperm(batch * nb, device="cuda", generator=g)
        table = perm.view(batch, nb).to(torch.int32)
        kp = torch.empty(batch * nb, bs, HKV, D, device="cuda", dtype=torch.bfloat16); vp = torch.empty_like(kp)
        kp[table.flatten().long()] = k.view(batch, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(batch * nb, bs, HKV, D)
        vp[table.flatten().long()] = v.view(batch, HKV, nb, bs, D).permute(0, 2, 3, 1, 4).reshape(batch * nb, bs, HKV, D)
        layouts[f"paged {bs}"] = (kp, vp, table)
    ref = attention_with_kvcache(q, k, v, lens)
    splits = (None, 8, 16, 32, 64) if batch == 1 else (None, 1, 2)
    fns = {}
    for name, (kk, vv, bt) in layouts.items():
        for s in splits:
            f = (lambda kk=kk, vv=vv, bt=bt, s=s: attention_with_kvcache(q, kk, vv, lens, block_table=bt, num_splits=s))
            err = (f().float() - ref.float()).abs().max().item()
            assert err < 2e-2, (name, s, err)
            fns[(name, s)] = f
    res = {key: [] for key in fns}
    keys = list(fns)
    for r in range(2):
        for key in (keys if r % 2 == 0 else keys[::-1]):
            res[key].append(tt.do_bench_cudagraph(fns[key], rep=100) * 1e3)
    print(f"batch {batch} x {cache} keys, us (median of 2 rounds):", flush=True)
    for name in layouts:
        print(f"  {name:10s} " + "  ".join(f"splits {s}: {statistics.median(res[(name, s)]):7.1f}" for s in splits), flush=True)
