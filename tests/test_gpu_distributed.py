"""Context-parallel attention on GPUs: tests/ring_worker.py --gpu, one rank per GPU over
NCCL with the cuTile kernels, against single-GPU attention() and its backward on the whole
sequence (forward, LSE, gradients; causal and not; grouped-query heads; bf16 at D=128 and
fp16 at D=64); on 4 GPUs or more also the ring of every GPU against rings of two on the same
inputs."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")]

WORKER = Path(__file__).with_name("ring_worker.py")
# The device notes' settings for NCCL on these hosts (NVLink multicast off).
NCCL_ENVIRONMENT = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                    "NVSHMEM_DISABLE_NVLS": "1"}


@pytest.mark.parametrize("options", [[], ["--group-size", "2"], ["--against-rings-of", "2"]],
                         ids=["one-ring", "rings-of-2", "against-rings-of-2"])
def test_the_ring_over_nccl_matches_its_reference(options):
    """Every GPU in one ring against one GPU, and (on 4 GPUs or more) rings of two side by
    side against one GPU, and the ring of every GPU against rings of two."""
    processes = torch.cuda.device_count()
    if options and processes < 4:
        pytest.skip("two rings of 2 need 4 GPUs")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc-per-node={processes}", str(WORKER), "--gpu"] + options,
                          capture_output=True, text=True, timeout=600,
                          env=os.environ | NCCL_ENVIRONMENT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count(": ok") == processes
