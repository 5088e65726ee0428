"""The forward that keeps the LSE (what a training step runs) at the shapes where tileiras
13.5 compiles another stack frame when the sequence length is a multiple of 16 (D=256
causal: 72 bytes against 56; D=64 causal: 16 against 0), beside cuDNN, in rotating rounds
of CUDA-graph replays. Run once per compiler (tileiras on PATH) with its own kernel cache:

    CUDA_TILE_CACHE_DIR=/tmp/cache-13.x python forward_lse_compilers.py LABEL

Prints one JSON line per shape: ours and cuDNN (ms, medians of the rounds) and ours/cuDNN.
"""

import json
import statistics
import subprocess
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench_cudagraph

from cutile_fmha import attention_with_lse
from cutile_fmha.assets import measure

ROUNDS = 5
SHAPES = [  # batch, heads, N, D, causal
    (4, 16, 4096, 256, True), (4, 16, 8192, 256, True), (4, 16, 8184, 256, True),
    (4, 16, 8192, 256, False), (4, 32, 8192, 64, True), (4, 32, 8184, 64, True)]
tileiras = subprocess.run(["tileiras", "--version"], capture_output=True,
                          text=True).stdout.split("release")[-1].split(",")[0].strip()
for batch, heads, n, d, causal in SHAPES:
    q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=torch.bfloat16)
               for _ in range(3))
    out, lse = attention_with_lse(q, k, v, is_causal=causal)
    reference = F.scaled_dot_product_attention(q[:1, :2].double(), k[:1, :2].double(),
                                               v[:1, :2].double(), is_causal=causal)
    error = (out[:1, :2].double() - reference).abs().max().item()
    assert error < 2e-2, error

    def cudnn():
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fns = [lambda: attention_with_lse(q, k, v, is_causal=causal), cudnn]
    times = measure.time_in_rounds(fns, ROUNDS, lambda fn: do_bench_cudagraph(fn, rep=100))
    ours, theirs = (statistics.median(t) for t in times)
    print(json.dumps({"label": sys.argv[1], "tileiras": tileiras, "shape": [batch, heads, n, d,
                      causal], "ours ms": round(ours, 4), "cudnn ms": round(theirs, 4),
                      "ours/cudnn": round(ours / theirs, 4), "max error": error}), flush=True)
