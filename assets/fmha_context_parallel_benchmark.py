"""Context-parallel benchmark: ring_attention across the GPUs of one host against one GPU
and against PyTorch's context_parallel (ring attention over SDPA), in the same run.

    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --standalone --nproc-per-node 2 assets/fmha_context_parallel_benchmark.py
    torchrun --standalone --nproc-per-node 2 assets/fmha_context_parallel_benchmark.py \\
        --seq-lens 131072 262144 --masks causal --markdown cp.md

One process per GPU. For each N and mask (B=1, H=32, D=128, bf16 by default) it times,
forward and forward+backward (the slowest rank's time, events around --iterations calls
after one warm-up): our attention() on the whole sequence on each GPU alone (where it
fits, up to --one-gpu-up-to: "one GPU"), ring_attention on zigzag shards across all of them
(and, with --ring-sizes, in rings of fewer GPUs side by side, each on its own copy), and
torch.distributed.tensor.experimental.context_parallel with each SDPA backend of
--sdpa-backends. It reports each time, TFLOPS per GPU (forward+backward counts 3.5x the
forward's FLOPs), the speed-up over our one GPU and the scaling efficiency (speed-up over
the number of GPUs; for a larger ring also from the smallest ring timed), and the peak
memory per GPU beyond the benchmark's own full tensors
(every rank holds them, to shard them and to run the one-GPU baseline). Rank 0 prints the table and writes it
with --json / --markdown.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

from cutile_fmha.assets import measure
from cutile_fmha.assets.measure import Column

# The device notes' settings for NCCL on these hosts (NVLink multicast off): set before the
# first communicator where the launcher has not.
NCCL_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}
FORWARD_AND_BACKWARD_FLOPS = 3.5  # the forward's two products and the backward's five
ONE_GPU, RING = "ours, one GPU", "ours, ring_attention"
COLUMNS = [Column("seq_len", "N"), Column("causal", "causal"), Column("method", "method"),
           Column("gpus", "GPUs"), Column("fwd_ms", "fwd (ms)", ".2f"),
           Column("fwdbwd_ms", "fwd+bwd (ms)", ".2f"),
           Column("fwdbwd_tflops_per_gpu", "fwd+bwd TFLOPS per GPU", ".0f"),
           Column("speedup", "fwd+bwd vs our one GPU", ".2f"),
           Column("efficiency", "scaling efficiency", ".2f"),
           Column("efficiency_from_smallest_ring", "scaling efficiency from the smallest ring",
                  ".2f"),
           Column("peak_gib", "peak memory per GPU beyond the inputs (GiB)", ".1f"),
           Column("note", "note")]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=measure.positive_int, nargs="+",
                        default=[32768, 65536, 131072, 262144])
    parser.add_argument("--masks", nargs="+", default=["causal", "full"],
                        choices=["causal", "full"])
    parser.add_argument("--batch", type=measure.positive_int, default=1)
    parser.add_argument("--heads", type=measure.positive_int, default=32)
    parser.add_argument("--kv-heads", type=measure.positive_int, default=None)
    parser.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(measure.DTYPES))
    parser.add_argument("--iterations", type=measure.positive_int, default=3)
    parser.add_argument("--one-gpu-up-to", type=measure.positive_int, default=None,
                        metavar="N", help="time the one-GPU baseline only up to this "
                        "sequence length (it takes minutes per call past 256k)")
    parser.add_argument("--ring-sizes", type=measure.positive_int, nargs="+", default=None,
                        metavar="GPUS", help="ring_attention across rings of these many GPUs "
                        "(each dividing the number of processes; default: one ring of all)")
    parser.add_argument("--sdpa-backends", nargs="+", default=["cudnn", "flash"],
                        choices=["cudnn", "flash", "efficient"],
                        help="PyTorch context_parallel's SDPA backends to time")
    measure.add_result_arguments(parser)
    args = parser.parse_args(argv)
    if args.kv_heads and args.heads % args.kv_heads:
        parser.error("--kv-heads must divide --heads")
    return args


def timed_ms(fn, iterations: int) -> float:
    """The slowest rank's milliseconds per call, after one warm-up call."""
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


def extra_peak_gib(baseline: int) -> float:
    """The largest peak allocation of any rank since the last reset beyond `baseline`
    bytes (what was allocated before: the benchmark's own full tensors), in GiB."""
    peak = torch.tensor(float(torch.cuda.max_memory_allocated() - baseline), device="cuda")
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return peak.item() / 2 ** 30


def measured(forward, backward_of, iterations: int) -> dict:
    """fwd and fwd+bwd milliseconds and the extra peak memory of `forward()` (its output's
    backward through `backward_of(out)`), or {"note": why not} where a rank ran out of
    memory or the method refused the shape."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated()
    try:
        with torch.no_grad():
            fwd = timed_ms(forward, iterations)
        both = timed_ms(lambda: backward_of(forward()), iterations)
    except Exception as error:  # out of memory, or a size a method does not take
        torch.cuda.empty_cache()
        return {"note": measure.one_line(error, 80)}
    return {"fwd_ms": fwd, "fwdbwd_ms": both, "peak_gib": extra_peak_gib(baseline)}


def add_scaling(row: dict, one_gpu_ms: float | None, smallest_ring: tuple | None) -> None:
    """Adds to a row of fwd+bwd milliseconds on row["gpus"] GPUs its speed-up over our one
    GPU and its scaling efficiency, and where `smallest_ring` (GPUs, ms) is a smaller ring
    of ours, the efficiency from it: its time over this one, over the ratio of GPUs."""
    if one_gpu_ms and row["gpus"] > 1:
        row["speedup"] = one_gpu_ms / row["fwdbwd_ms"]
        row["efficiency"] = row["speedup"] / row["gpus"]
    if smallest_ring and smallest_ring[0] < row["gpus"]:
        gpus, ms = smallest_ring
        row["efficiency_from_smallest_ring"] = ms / row["fwdbwd_ms"] / (row["gpus"] / gpus)


def ring_groups(sizes: list[int] | None, world: int) -> dict:
    """{ring size: its process group (None: the world)}, made on every rank in one order;
    a size that does not divide the world raises ValueError."""
    sizes = sorted(set(sizes or [world]))
    for size in sizes:
        if world % size:
            raise ValueError(f"--ring-sizes: {size} does not divide the {world} processes")
    return {size: None if size == world else dist.new_subgroups(size)[0] for size in sizes}


def methods(args, q, k, v, grad, causal: bool, mesh, rings: dict):
    """(name, GPUs, forward, backward_of) of each method on the full (B, H, N, D) tensors,
    yielded one at a time, our ring once per ring size of `rings` (``ring_groups``'):
    PyTorch's context_parallel is timed inside its context, which shards the tensors once
    (head-tail balanced under the causal mask, in plain chunks without it), in place: the
    full tensors are spent after the last backend."""
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import _cp_options as options
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from cutile_fmha import attention
    from cutile_fmha.distributed import ring_attention, zigzag_shard

    world = dist.get_world_size()
    gqa = q.shape[1] != k.shape[1]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    if args.one_gpu_up_to is None or q.shape[2] <= args.one_gpu_up_to:
        yield (ONE_GPU, 1, lambda: attention(*leaves, is_causal=causal, enable_gqa=gqa),
               lambda out: out.backward(grad))
    for size, group in rings.items():
        ring_rank = dist.get_rank(group)
        shards = [zigzag_shard(t, ring_rank, size).requires_grad_() for t in (q, k, v)]
        grad_shard = zigzag_shard(grad, ring_rank, size)
        yield (RING, size,
               lambda: ring_attention(*shards, group=group, is_causal=causal),
               lambda out: out.backward(grad_shard))
        del shards
    del leaves
    backends = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION}
    # Its head-tail load balance takes only the causal mask: without one, plain chunks.
    options.enable_load_balance = causal
    for index, name in enumerate(args.sdpa_backends):
        # Copies for every backend but the last, which takes the full tensors themselves
        # (a copy is 32 GiB a rank at 1M tokens).
        last = index == len(args.sdpa_backends) - 1
        buffers = [t.detach() if last else t.detach().clone() for t in (q, k, v, grad)]
        with context_parallel(mesh, buffers=buffers, buffer_seq_dims=[2] * 4,
                              no_restore_buffers=set(buffers)):
            cq, ck, cv, cgrad = buffers
            for t in (cq, ck, cv):
                t.requires_grad_()
            with sdpa_kernel(backends[name]):
                yield (f"PyTorch context_parallel ({name})", world,
                       lambda: torch.nn.functional.scaled_dot_product_attention(
                           cq, ck, cv, is_causal=causal, enable_gqa=gqa),
                       lambda out: out.backward(cgrad))
        del buffers, cq, ck, cv, cgrad


def main(argv=None) -> int:
    args = parse_args(argv)
    for name, value in NCCL_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    if (problem := measure.gpu_problem("The context-parallel benchmark needs")):
        print(problem, file=sys.stderr)
        return 1
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    mesh = init_device_mesh("cuda", (world,))
    rings = ring_groups(args.ring_sizes, world)
    rows = []
    for n in args.seq_lens:
        for causal in (mask == "causal" for mask in args.masks):
            shape = measure.Shape(args.batch, args.heads, n, n, args.head_dim, causal,
                                  args.dtype, kv_heads=args.kv_heads)
            q, k, v = measure.make_inputs(shape, seed=n)
            grad = torch.randn_like(q)
            one_gpu_ms = smallest_ring = None
            for name, gpus, forward, backward_of in methods(args, q, k, v, grad, causal, mesh,
                                                            rings):
                row = {"seq_len": n, "causal": causal, "method": name, "gpus": gpus} | \
                    measured(forward, backward_of, args.iterations)
                if "fwdbwd_ms" in row:
                    flops = FORWARD_AND_BACKWARD_FLOPS * shape.flops
                    row["fwdbwd_tflops_per_gpu"] = measure.tflops(flops, row["fwdbwd_ms"]) / gpus
                    add_scaling(row, one_gpu_ms, smallest_ring if name == RING else None)
                    if name == ONE_GPU:
                        one_gpu_ms = row["fwdbwd_ms"]
                    elif name == RING and smallest_ring is None:  # rings come smallest first
                        smallest_ring = (gpus, row["fwdbwd_ms"])
                rows.append(row)
                if rank == 0:
                    print(measure.format_table([row], COLUMNS), flush=True)
            del q, k, v, grad
    if rank == 0:
        context = measure.run_context() | {
            "gpus": world, "shape": f"B={args.batch}, {measure.describe_heads(args.heads, args.kv_heads)}, "
                                    f"D={args.head_dim}, {args.dtype}",
            "iterations": args.iterations,
            "nccl": ", ".join(f"{name}={os.environ[name]}" for name in NCCL_ENVIRONMENT)}
        measure.report(args, "cuTile FMHA context parallel", context, rows, COLUMNS)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
