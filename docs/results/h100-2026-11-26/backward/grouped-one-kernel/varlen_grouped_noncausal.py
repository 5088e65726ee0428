"""Packed batches (varlen_backward), D=128, 4 or 8 query heads to a K/V head: "dkdv_dq" forced
against the two kernels, one process, rotating rounds of CUDA-graph replays. Without the
causal mask (and one causal row), or with the argument "causal" the causal shapes."""
import dataclasses, statistics
import torch, triton.testing as tt
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps import backward as launcher
from cutile_fmha.steps.varlen import SequenceBounds, varlen_backward, varlen_forward

BASE = backward_entry_for("sm_90")
ONE = dataclasses.replace(BASE, launches=dict(BASE.launches) | {128: BASE.launches[128] | {
    "dkdv_dq": dataclasses.replace(BASE.launches[128]["dkdv_dq"], only_with=None)}})
TWO = dataclasses.replace(BASE, launches=dict(BASE.launches) | {128: {
    k: v for k, v in BASE.launches[128].items() if k != "dkdv_dq"}})
print(torch.cuda.get_device_name(), flush=True)
import sys
MIXED = [512, 8192, 1024, 4096, 2048, 3000, 700, 6000]
CASES = (([2048] * 16, 32, 8, False), (MIXED, 32, 8, False), ([2048] * 4, 16, 4, False), ([2048] * 16, 32, 8, True))
if sys.argv[1:] == ["causal"]:
    CASES = (([2048] * 4, 16, 4, True), (MIXED, 32, 8, True), ([2048] * 16, 64, 8, True), ([1024] * 8, 32, 8, True),
             ([4096] * 2, 16, 4, True))
for lengths, H, HKV, causal in CASES:
    g = torch.Generator(device="cuda").manual_seed(len(lengths) + H)
    total, D = sum(lengths), 128
    q, do = (torch.randn(total, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    k, v = (torch.randn(total, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
    views = [t.transpose(0, 1)[None] for t in (q, k, v, do)]
    bounds = SequenceBounds.packed(cu, cu)
    m = max(lengths)
    out, lse = varlen_forward(*views[:3], bounds, m, causal=causal, scale=D ** -0.5, with_lse=True)
    fns, grads = {}, {}
    for kind, entry in (("two kernels", TWO), ("one kernel", ONE)):
        def fn(entry=entry):
            launcher.backward_entry_for = lambda arch: entry
            return varlen_backward(*views[:3], out, lse, views[3], bounds, m, m, causal=causal, scale=D ** -0.5)
        fns[kind] = fn
        grads[kind] = [t.clone() for t in fn()]
    torch.cuda.synchronize()
    err = [round(float((a.float() - b.float()).abs().max() / b.float().abs().max()), 5)
           for a, b in zip(grads["one kernel"], grads["two kernels"])]
    res = {n: [] for n in fns}
    for r in range(5):
        for n in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            res[n].append(tt.do_bench_cudagraph(fns[n], rep=120))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(f"{len(lengths)} seqs {min(lengths)}-{m} H={H}/{HKV} {'causal' if causal else 'non-causal'}: "
          f"two {med['two kernels']:.3f} ms, one {med['one kernel']:.3f} ms, one/two "
          f"{med['one kernel'] / med['two kernels']:.3f}; one vs two rel. dq dk dv {err}", flush=True)
launcher.backward_entry_for = backward_entry_for
