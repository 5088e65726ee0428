"""One rank of the ring-attention checks, launched with torch.distributed.run:

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/ring_worker.py
    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/ring_worker.py --gpu

On CPUs (tests/test_distributed.py): gloo, plain-PyTorch local attention, float64 inputs
(or bfloat16), against the same attention on the whole sequence. With --gpu
(tests/test_gpu_distributed.py): NCCL, one GPU per rank, the cuTile kernels, bf16 at D=128
and fp16 at D=64, against single-GPU attention() and its backward on the whole sequence.
Forward, LSE and gradients, causal and not, grouped-query heads; each rank checks its own
shard, prints "rank N: ok" or what differs, and exits non-zero on a mismatch.
--group-size S runs rings of S ranks side by side (a process group each, as data parallel
beside context parallel), each on its own sequence. --against-rings-of S checks the ring of
every rank against rings of S ranks side by side on the same inputs instead (the 4-GPU
result against the 2-GPU one), gathered and unsharded."""

import argparse
import itertools
import sys

import torch
import torch.distributed as dist

from cutile_fmha.distributed import TORCH_LOCAL, ring_attention, zigzag_shard, zigzag_unshard
from cutile_fmha.steps.reference import reference as float64_reference


def whole_sequence(q, k, v, causal: bool, scale: float):
    """(out, lse) of the full sequence in float64, differentiable."""
    return float64_reference(q, k, v, causal=causal, scale=scale)


def one_gpu(q, k, v, causal: bool, scale: float):
    """(out, lse) of the full sequence with the single-GPU kernels, differentiable."""
    from cutile_fmha import attention_with_lse
    return attention_with_lse(q, k, v, is_causal=causal, scale=scale, enable_gqa=True)


def smaller_rings(size: int, local):
    """A reference made of rings of `size` ranks side by side, each on the whole sequence:
    a function of (q, k, v, grad, causal) returning the whole sequence's out, lse, dq, dk
    and dv, gathered from one such ring's shards. Every rank makes the subgroups, in order."""
    group, _ = dist.new_subgroups(size)

    def reference(q, k, v, grad, causal: bool) -> list:
        rank = dist.get_rank(group)
        shards = [zigzag_shard(t, rank, size).requires_grad_() for t in (q, k, v)]
        out, lse = ring_attention(*shards, group=group, is_causal=causal, return_lse=True,
                                  local=local)
        out.backward(zigzag_shard(grad, rank, size))
        whole = []
        for shard in [out.detach(), lse] + [t.grad for t in shards]:
            gathered = [torch.empty_like(shard) for _ in range(size)]
            dist.all_gather(gathered, shard.contiguous(), group=group)
            whole.append(zigzag_unshard(gathered))
        return whole
    return reference


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", action="store_true")
    parser.add_argument("--bfloat16", action="store_true",
                        help="on CPUs, bfloat16 shards instead of float64 (the GPU's dtype)")
    rings = parser.add_mutually_exclusive_group()
    rings.add_argument("--group-size", type=int, default=None,
                       help="rings of this many consecutive ranks, each on its own sequence "
                            "(data parallel beside context parallel)")
    rings.add_argument("--against-rings-of", type=int, default=None, metavar="SIZE",
                       help="the reference: rings of SIZE ranks on the same inputs")
    args = parser.parse_args()
    dist.init_process_group("nccl" if args.gpu else "gloo")
    global_rank = dist.get_rank()
    group, ring_index = None, 0
    if args.group_size:
        group, _ = dist.new_subgroups(args.group_size)
        ring_index = global_rank // args.group_size
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if args.gpu:
        torch.cuda.set_device(global_rank % torch.cuda.device_count())
        device, local, reference = "cuda", None, one_gpu
        cases = [(torch.bfloat16, 128), (torch.float16, 64)]  # (dtype, head dim)
        chunk, batch, heads, kv_heads, tolerance = 320, 1, 8, 2, 2e-2
    else:  # an odd chunk length: the shards are no power of two
        device, local, reference = "cpu", TORCH_LOCAL, whole_sequence
        cases = [(torch.bfloat16 if args.bfloat16 else torch.float64, 16)]
        chunk, batch, heads, kv_heads = 5, 2, 4, 2
        tolerance = 2e-2 if args.bfloat16 else 1e-4
    length = 2 * world * chunk
    if args.against_rings_of:
        smaller = smaller_rings(args.against_rings_of, local)
    failures, largest = [], {}  # largest: each tensor's largest error relative to its scale
    for (dtype, head_dim), causal in itertools.product(cases, (False, True)):
        generator = torch.Generator(device=device).manual_seed(7 + ring_index)
        q, k, v, grad = (torch.randn(batch, h, length, head_dim, dtype=dtype, device=device,
                                     generator=generator)
                         for h in (heads, kv_heads, kv_heads, heads))
        if args.against_rings_of:
            expected = smaller(q, k, v, grad, causal)
        else:
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out, lse = reference(*leaves, causal, head_dim ** -0.5)
            out.backward(grad)
            expected = [out.detach(), lse.detach()] + [t.grad for t in leaves]
        shards = [zigzag_shard(t, rank, world).requires_grad_() for t in (q, k, v)]
        ring_out, ring_lse = ring_attention(*shards, group=group, is_causal=causal,
                                            return_lse=True, local=local)
        ring_out.backward(zigzag_shard(grad, rank, world))
        got = [ring_out.detach(), ring_lse] + [t.grad for t in shards]
        for name, full, mine in zip(("out", "lse", "dq", "dk", "dv"), expected, got):
            full = zigzag_shard(full, rank, world).double()
            error = (full - mine.double()).abs().max().item()
            scale = max(full.abs().max().item(), 1.0)
            largest[name] = max(largest.get(name, 0.0), error / scale)
            if error > tolerance * scale:
                failures.append(f"rank {global_rank} {dtype} D={head_dim} causal={causal} "
                                f"{name}: error {error:.2e}")
        gathered = [torch.empty_like(ring_out) for _ in range(world)]
        dist.all_gather(gathered, ring_out.detach().contiguous(), group=group)
        whole = zigzag_unshard(gathered).double() - expected[0].double()
        if whole.abs().max() > tolerance * max(expected[0].abs().max().item(), 1.0):
            failures.append(f"rank {global_rank} {dtype} D={head_dim} causal={causal}: "
                            f"unsharded output differs")
    if world > 1:  # shards of different lengths: the same clear error on every rank
        mismatched = torch.zeros(batch, heads, 2 * chunk + 2 * rank, head_dim, dtype=dtype,
                                 device=device)
        try:
            ring_attention(mismatched, mismatched, mismatched, group=group, local=local)
            failures.append(f"rank {global_rank}: shards of different shapes were not refused")
        except ValueError as error:
            if "every rank must pass shards of one shape" not in str(error):
                failures.append(f"rank {global_rank}: unexpected error {error}")
    dist.destroy_process_group()
    errors = ", ".join(f"{name} {error:.1e}" for name, error in largest.items())
    print(f"rank {global_rank} errors over max(largest entry, 1), tolerance {tolerance:.0e}: "
          f"{errors}\n" + ("\n".join(failures) or f"rank {global_rank}: ok"), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
