"""Context-parallel attention without a GPU: the LSE merge against a NumPy model, the
zigzag sharding and its inverse, the ring's schedule (each step's blocks cover the causal
mask once, with equal work per rank), argument checks, and the ring itself over gloo
with 1, 2, 3, 4 and 8 CPU processes and plain-PyTorch local attention standing in for the
kernels (tests/ring_worker.py). The GPU run (NCCL, the kernels) is tests/test_gpu_distributed.py."""

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from cutile_fmha import distributed
from cutile_fmha.distributed import (TORCH_LOCAL, merge_partials, ring_attention, zigzag_shard,
                                     zigzag_unshard)

WORKER = Path(__file__).with_name("ring_worker.py")


def numpy_attention(q, k, scale):
    """(lse, weights) of rows q against keys k, in float64 NumPy."""
    scores = q @ k.T * scale
    lse = np.log(np.exp(scores).sum(-1))
    return lse, np.exp(scores - lse[:, None])


def test_merging_two_partial_attentions_is_the_attention_to_both_key_sets():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(6, 8)), rng.normal(size=(10, 8)), rng.normal(size=(10, 8))
    lse, weights = numpy_attention(q, k, 0.3)
    parts = []
    for keys in (slice(0, 4), slice(4, 10)):
        part_lse, part_weights = numpy_attention(q, k[keys], 0.3)
        parts.append((torch.tensor(part_weights @ v[keys], dtype=torch.float32),
                      torch.tensor(part_lse, dtype=torch.float32)))
    out, merged_lse = merge_partials(torch.zeros(6, 8), torch.full((6,), -math.inf), *parts[0])
    out, merged_lse = merge_partials(out, merged_lse, *parts[1])
    assert np.allclose(out.numpy(), weights @ v, atol=1e-5)
    assert np.allclose(merged_lse.numpy(), lse, atol=1e-5)


def test_rows_that_saw_nothing_stay_zero_and_take_a_block_whole():
    out, lse = torch.zeros(2, 4), torch.full((2,), -math.inf)
    block_out, block_lse = torch.ones(2, 4), torch.tensor([-math.inf, 0.5])
    merged, merged_lse = merge_partials(out, lse, block_out, block_lse)
    assert merged[0].eq(0).all() and math.isinf(merged_lse[0]) and merged_lse[0] < 0
    assert merged[1].eq(1).all() and merged_lse[1] == 0.5


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_zigzag_shards_are_head_and_tail_chunks_and_unshard_back(world_size):
    x = torch.arange(2 * world_size * 3)[None, None, :, None].float()
    shards = [zigzag_shard(x, rank, world_size) for rank in range(world_size)]
    chunks = x.chunk(2 * world_size, 2)
    for rank, shard in enumerate(shards):
        assert torch.equal(shard, torch.cat([chunks[rank], chunks[-1 - rank]], 2))
    assert torch.equal(zigzag_unshard(shards), x)


def test_sharding_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match=r"sequence length \(dimension 2, 10\) must be "
                                         r"divisible by 2 x world_size = 4"):
        zigzag_shard(torch.zeros(1, 1, 10, 4), 0, 2)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        zigzag_shard(torch.zeros(1, 1, 8, 4), 2, 2)
    with pytest.raises(ValueError, match="all of one shape"):
        zigzag_unshard([torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 6, 4)])


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_the_causal_schedule_covers_the_mask_once_with_equal_work_per_rank(world_size):
    """Each step's (query rows, key rows, causal) of every rank, mapped back to positions
    in the sequence, covers each pair of the causal mask exactly once; every step but the
    diagonal one has 2c² pairs (c: a chunk's length), the diagonal one c more, so every
    rank has the same work (the zigzag's load balance)."""
    chunk = 3
    length = 2 * world_size * chunk
    positions = torch.arange(length)[None, None, :, None]
    covered = torch.zeros(length, length, dtype=torch.int64)
    per_rank = []
    for rank in range(world_size):
        mine = zigzag_shard(positions, rank, world_size)[0, 0, :, 0]
        work = []
        for step in range(world_size):
            source = (rank - step) % world_size
            theirs = zigzag_shard(positions, source, world_size)[0, 0, :, 0]
            rows, keys, causal = distributed._step_blocks(rank, source, True, 2 * chunk)
            block = torch.ones(len(mine[rows]), len(theirs[keys]), dtype=torch.int64)
            if causal:
                block = block.tril()
            covered[mine[rows][:, None], theirs[keys][None, :]] += block
            work.append(int(block.sum()))
        assert work == [2 * chunk ** 2 + chunk] + [2 * chunk ** 2] * (world_size - 1)
        per_rank.append(sum(work))
    assert torch.equal(covered, torch.ones(length, length, dtype=torch.int64).tril())
    assert len(set(per_rank)) == 1


def test_ring_attention_needs_an_initialised_process_group():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised here")
    q = torch.zeros(1, 2, 4, 8)
    with pytest.raises(RuntimeError, match="needs torch.distributed initialised"):
        ring_attention(q, q, q)


@pytest.fixture
def one_rank_group(tmp_path):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised here")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("shapes,message", [
    (((1, 4, 6, 8), (1, 3, 6, 8), (1, 3, 6, 8)), "multiple of key's"),
    (((1, 2, 6, 8), (1, 2, 4, 8), (1, 2, 4, 8)), "one even, non-zero length"),
    (((1, 2, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)), "one even, non-zero length"),
    (((1, 2, 6, 8), (1, 2, 6, 8), (1, 2, 6, 4)), "key and value must be one shape"),
    (((2, 6, 8), (2, 6, 8), (2, 6, 8)), r"query must be this rank's shard, \(batch, heads"),
])
def test_shards_are_checked(one_rank_group, shapes, message):
    with pytest.raises(ValueError, match=message):
        ring_attention(*(torch.zeros(shape) for shape in shapes), local=TORCH_LOCAL)


def test_one_rank_is_plain_attention(one_rank_group):
    q, k, v = (torch.randn(1, 4, 12, 8, dtype=torch.float64) for _ in range(3))
    out, lse = ring_attention(q, k, v, is_causal=True, return_lse=True, local=TORCH_LOCAL)
    expected, expected_lse = TORCH_LOCAL.forward(q, k, v, True, 8 ** -0.5)
    assert torch.allclose(out, expected) and torch.allclose(lse, expected_lse.float())


@pytest.mark.parametrize("processes,options", [
    (2, []), (3, []), (4, []), (8, []),
    (3, ["--bfloat16"]),  # float32 accumulators, dK/dV's last hop in bfloat16
    (4, ["--group-size", "2"]),  # two rings of two ranks in their own process groups
    (4, ["--against-rings-of", "2"]),  # a ring of four against two rings of two
], ids=["2", "3", "4", "8", "3-bfloat16", "4-two-rings-of-2", "4-against-rings-of-2"])
def test_the_ring_over_gloo_matches_the_whole_sequence(processes, options):
    """Forward, LSE and gradients of every rank's shard, causal and not, GQA: each rank
    checks itself and exits non-zero on a mismatch."""
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", str(WORKER)] + options,
                          capture_output=True, text=True, timeout=300,
                          env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(": ok") == processes
