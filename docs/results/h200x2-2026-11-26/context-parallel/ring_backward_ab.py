"""The ring's forward+backward in three forms, in rotating rounds on the same inputs:
- "two kernels, per-step extras": the backward's dK/dV and dQ kernels (forced with
  torch.use_deterministic_algorithms), each step making its own Delta, its own zeroed dQ
  buffer cast to the shards' dtype, then added into the ring's float32 sum (the ring as
  first measured);
- "one kernel, per-step extras": the same steps with the table's launch (dQ added by the
  dK/dV kernel at D=128 since 2026-11-26);
- "one kernel, trimmed": the ring as committed: Delta once, each block's dQ added by the
  kernel straight into the ring's float32 sum.
The trimmed ring was not kept: this runs on top of ring-trim.diff (LocalAttention with
row_dot, and a backward that adds into the ring's dq), not on the committed ring.
Run: torchrun --standalone --nproc-per-node 2 ring_backward_ab.py [--seq-lens ...]."""

import argparse
import os

import torch
import torch.distributed as dist

for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(name, "0" if name == "NCCL_NVLS_ENABLE" else "1")

from cutile_fmha.distributed import CUTILE_LOCAL, LocalAttention, ring_attention, zigzag_shard
from cutile_fmha.steps.backward import attention_backward


def per_step_backward(q, k, v, out, lse, delta, grad_out, dq, causal, scale):
    block_dq, dk, dv = attention_backward(q, k, v, out, lse, grad_out, causal=causal, scale=scale)
    dq += block_dq
    return dk, dv


PER_STEP = LocalAttention(CUTILE_LOCAL.forward,
                          lambda out, grad_out: out.new_empty(out.shape[:-1], dtype=torch.float32),
                          per_step_backward)
FORMS = {"two kernels, per-step extras": (PER_STEP, True),
         "one kernel, per-step extras": (PER_STEP, False),
         "one kernel, trimmed": (CUTILE_LOCAL, False)}


def timed_ms(fn, iterations):
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iterations):
        fn()
    end.record()
    torch.cuda.synchronize()
    ms = torch.tensor(start.elapsed_time(end) / iterations, device="cuda")
    dist.all_reduce(ms, op=dist.ReduceOp.MAX)
    return ms.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank)
    for n in args.seq_lens:
        for causal in (True, False):
            generator = torch.Generator(device="cuda").manual_seed(n)
            q, k, v, grad = (torch.randn(1, 32, n, 128, generator=generator, device="cuda",
                                         dtype=torch.bfloat16) for _ in range(4))
            shards = [zigzag_shard(t, rank, world) for t in (q, k, v)]
            grad_shard = zigzag_shard(grad, rank, world)
            del q, k, v, grad
            leaves = [s.detach().requires_grad_() for s in shards]

            def step(local, deterministic):
                torch.use_deterministic_algorithms(deterministic, warn_only=True)
                try:
                    for t in leaves:
                        t.grad = None
                    out = ring_attention(*leaves, is_causal=causal, local=local)
                    out.backward(grad_shard)
                finally:
                    torch.use_deterministic_algorithms(False)
                return [t.grad for t in leaves]

            grads, peak_gib = {}, {}
            for name, form in FORMS.items():
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                baseline = torch.cuda.memory_allocated()
                grads[name] = [g.clone() for g in step(*form)]
                peak = torch.tensor(float(torch.cuda.max_memory_allocated() - baseline),
                                    device="cuda")
                dist.all_reduce(peak, op=dist.ReduceOp.MAX)
                peak_gib[name] = peak.item() / 2 ** 30
            base = grads["two kernels, per-step extras"]
            errors = {name: [((g.float() - b.float()).abs().max() / b.float().abs().max()).item()
                             for g, b in zip(got, base)] for name, got in grads.items()}
            del grads, base
            times = {name: [] for name in FORMS}
            for round_ in range(args.rounds):
                order = list(FORMS)[round_ % 3:] + list(FORMS)[:round_ % 3]
                for name in order:
                    times[name].append(timed_ms(lambda: step(*FORMS[name]), args.iterations))
            if rank == 0:
                reference = sorted(times["two kernels, per-step extras"])[args.rounds // 2]
                for name, ms in times.items():
                    median = sorted(ms)[args.rounds // 2]
                    print(f"N={n} causal={causal} {name}: fwd+bwd median {median:.2f} ms "
                          f"(rounds {', '.join(f'{t:.2f}' for t in ms)}), "
                          f"{median / reference:.3f}x the two kernels' time; peak "
                          f"{peak_gib[name]:.2f} GiB beyond the shards; "
                          f"dq/dk/dv vs two kernels {', '.join(f'{e:.1e}' for e in errors[name])}",
                          flush=True)
            shards = leaves = grad_shard = None  # before the next shape's tensors
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
