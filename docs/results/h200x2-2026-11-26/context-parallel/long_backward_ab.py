"""One GPU: the backward at B=1, H=32, D=128, bf16 and long N with the table's launch
(dQ added by the dK/dV kernel, "dkdv_dq") against the two kernels (forced with
torch.use_deterministic_algorithms), rotating rounds, timed with CUDA events (the calls
take 0.1-2 s). Run: python long_backward_ab.py [--seq-lens ...]."""

import argparse

import torch

from cutile_fmha import attention_with_lse
from cutile_fmha.steps.backward import attention_backward


def timed_ms(fn, iterations):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iterations


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 32768, 65536, 131072])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2)
    args = parser.parse_args()
    for n in args.seq_lens:
        for causal in (False, True):
            generator = torch.Generator(device="cuda").manual_seed(n)
            q, k, v, grad = (torch.randn(1, 32, n, 128, generator=generator, device="cuda",
                                         dtype=torch.bfloat16) for _ in range(4))
            out, lse = attention_with_lse(q, k, v, is_causal=causal)

            def backward(two_kernels):
                torch.use_deterministic_algorithms(two_kernels, warn_only=True)
                try:
                    return attention_backward(q, k, v, out, lse, grad, causal=causal)
                finally:
                    torch.use_deterministic_algorithms(False)

            one, two = backward(False), backward(True)
            errors = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item()
                      for a, b in zip(one, two)]
            del one, two
            times = {False: [], True: []}
            for round_ in range(args.rounds):
                for two_kernels in ((False, True) if round_ % 2 == 0 else (True, False)):
                    times[two_kernels].append(timed_ms(lambda: backward(two_kernels),
                                                       args.iterations))
            one_ms, two_ms = (sorted(times[f])[args.rounds // 2] for f in (False, True))
            print(f"N={n} causal={causal}: one kernel {one_ms:.2f} ms "
                  f"({', '.join(f'{t:.2f}' for t in times[False])}), two kernels {two_ms:.2f} ms "
                  f"({', '.join(f'{t:.2f}' for t in times[True])}), one / two {one_ms / two_ms:.3f}; "
                  f"dq/dk/dv one vs two {', '.join(f'{e:.1e}' for e in errors)}", flush=True)
            q = k = v = grad = out = lse = None  # before the next shape's tensors
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
