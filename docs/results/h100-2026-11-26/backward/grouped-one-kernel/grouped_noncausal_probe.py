"""D=128 backward with grouped query heads (4 or 8 to a K/V head), without the causal mask:
"dkdv_dq" (one kernel, dQ added with atomics) forced against the table's two kernels, and
cuDNN. One process, rotating rounds, ours in CUDA graphs, cuDNN eager. Causal rows are
controls (the table keeps two kernels there because one lost)."""
import dataclasses, os, statistics
import torch, triton.testing as tt
from torch.nn.attention import sdpa_kernel, SDPBackend
from cutile_fmha import attention_with_lse
from cutile_fmha.platforms.backward import backward_entry_for
from cutile_fmha.steps.backward import attention_backward
from cutile_fmha.steps.launcher import device_facts

ROUNDS = int(os.environ.get("ROUNDS", "5"))
BASE = backward_entry_for(device_facts(torch.device("cuda"))[0])
ONE = dataclasses.replace(BASE, launches=dict(BASE.launches) | {128: BASE.launches[128] | {
    "dkdv_dq": dataclasses.replace(BASE.launches[128]["dkdv_dq"], only_with=None)}})
print(torch.cuda.get_device_name(), flush=True)
for B, H, HKV, N, causal, dtype in ((4, 16, 4, 2048, False, torch.bfloat16), (8, 32, 8, 1024, False, torch.bfloat16),
                                    (4, 32, 8, 4096, False, torch.bfloat16), (2, 32, 8, 8192, False, torch.bfloat16),
                                    (1, 32, 8, 16384, False, torch.bfloat16), (4, 64, 8, 4096, False, torch.bfloat16),
                                    (4, 32, 8, 4096, False, torch.float16), (4, 16, 4, 2048, False, torch.float16),
                                    (4, 32, 8, 4096, True, torch.bfloat16), (1, 32, 8, 16384, True, torch.bfloat16)):
    g = torch.Generator(device="cuda").manual_seed(N + H + HKV)
    q, do = (torch.randn(B, H, N, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    k, v = (torch.randn(B, HKV, N, 128, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    out, lse = attention_with_lse(q, k, v, is_causal=causal, enable_gqa=True)
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=causal, enable_gqa=True)
    fns = {"two kernels": lambda: attention_backward(q, k, v, out, lse, do, causal=causal, entry=BASE),
           "one kernel": lambda: attention_backward(q, k, v, out, lse, do, causal=causal, entry=ONE),
           "cudnn": lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)}
    grads = {n: f() for n, f in fns.items()}
    torch.cuda.synchronize()
    err = {n: [round(float((a.float() - b.float()).abs().max() / b.float().abs().max()), 4)
               for a, b in zip(grads[n], grads["cudnn"])] for n in ("two kernels", "one kernel")}
    res = {n: [] for n in fns}
    names = list(fns)
    for r in range(ROUNDS):
        for n in names[r % 3:] + names[:r % 3]:
            res[n].append((tt.do_bench if n == "cudnn" else tt.do_bench_cudagraph)(fns[n], rep=120))
    med = {n: statistics.median(t) for n, t in res.items()}
    print(f"{str(dtype)[6:]} B={B} H={H}/{HKV} N={N} {'causal' if causal else 'non-causal'}: "
          f"two {med['two kernels']:.3f} ms, one {med['one kernel']:.3f} ms "
          f"(one/two {med['one kernel'] / med['two kernels']:.3f}), cuDNN {med['cudnn']:.3f} "
          f"(speed/cuDNN two {med['cudnn'] / med['two kernels']:.3f}, one {med['cudnn'] / med['one kernel']:.3f}); "
          f"rel err vs cuDNN {err}; rounds one {[round(x, 3) for x in res['one kernel']]} "
          f"two {[round(x, 3) for x in res['two kernels']]}", flush=True)
