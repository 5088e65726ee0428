"""The variable-length kernels numbering their CTAs as the dense ones do under the causal
mask (tile_major: the longest tile of every (head, sequence) pair of a group first)
against the package before it (cutile_fmha_old: one (head, sequence) pair after another),
forward and backward on packed batches, bf16, rotating rounds of CUDA-graph replays in one
process. One JSON line per case."""
import json, statistics
import torch, triton.testing as tt
from cutile_fmha.steps import varlen as new_varlen
from cutile_fmha_old.steps import varlen as old_varlen

ROUNDS = 5


def rel(a, b):
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def case(lengths, H, HKV, D, causal):
    g = torch.Generator(device="cuda").manual_seed(len(lengths) + H + D)
    total = sum(lengths)
    q, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    views = [t.transpose(0, 1)[None] for t in (q, k, v, do)]
    m = max(lengths)
    fns = {}
    for name, module in (("new", new_varlen), ("old", old_varlen)):
        bounds = module.SequenceBounds.packed(cu, cu)
        out, lse = module.varlen_forward(*views[:3], bounds, m, causal=causal, scale=D ** -0.5, with_lse=True)
        fns[f"{name} forward"] = lambda module=module, bounds=bounds: module.varlen_forward(
            *views[:3], bounds, m, causal=causal, scale=D ** -0.5, with_lse=True)
        fns[f"{name} backward"] = lambda module=module, bounds=bounds, out=out, lse=lse: module.varlen_backward(
            *views[:3], out, lse, views[3], bounds, m, m, causal=causal, scale=D ** -0.5)
    results = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    check = {"forward": [rel(a, b) for a, b in zip(results["new forward"], results["old forward"])],
             "backward": [rel(a, b) for a, b in zip(results["new backward"], results["old backward"])]}
    times = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for n in names[r % len(names):] + names[:r % len(names)]:
            times[n].append(tt.do_bench_cudagraph(fns[n], rep=60))
    med = {n: statistics.median(t) for n, t in times.items()}
    print(json.dumps({"case": f"{len(lengths)} seqs {min(lengths)}-{m} H={H}/{HKV} D={D} "
                              f"{'causal' if causal else 'non-causal'}", "ms": med,
                      "new_over_old": {"forward": med["new forward"] / med["old forward"],
                                       "backward": med["new backward"] / med["old backward"]},
                      "check": check, "rounds": times}), flush=True)


print(json.dumps({"gpu": torch.cuda.get_device_name()}), flush=True)
case([2048] * 4, 16, 4, 128, True)      # the Llama demo's packed training
case([2048] * 16, 32, 8, 128, True)
case([512, 1024, 2048, 4096, 8192, 1000, 3000, 700], 32, 8, 128, True)
case([1024] * 8, 32, 32, 64, True)
case([4096] * 4, 16, 16, 256, True)
case([2048] * 16, 32, 8, 128, False)    # not reordered: a control
