"""The cubins the launcher compiles at run time, for comparison with the compile-only export
(steps/compile.py): runs attention() forward and backward on a few shapes with a fresh
cuTile cache (CUDA_TILE_CACHE_DIR), then writes every cached cubin to DIR with its kernel
name and the remarks tileiras wrote. Run:
CUDA_TILE_CACHE_DIR=/tmp/ctcache python run_time_cubins.py DIR"""

import json
import os
import sys

import torch

from cutile_fmha import attention
from cutile_cache._cache import cache_entries, cache_lookup

out_dir = sys.argv[1]
os.makedirs(out_dir, exist_ok=True)
SHAPES = [(4, 32, 32, 4096, 128, True), (4, 32, 32, 4096, 128, False),
          (4, 32, 32, 4096, 64, True), (4, 16, 16, 4096, 256, True),
          (2, 32, 8, 1000, 128, True)]  # grouped heads; rows not a multiple of 16
for b, h, hkv, n, d, causal in SHAPES:
    q = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, hkv, n, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    attention(q, k, v, is_causal=causal, enable_gqa=h != hkv).backward(torch.randn_like(q))
    torch.cuda.synchronize()
cache_dir = os.environ["CUDA_TILE_CACHE_DIR"]
index = []
for i, entry in enumerate(list(cache_entries(cache_dir))):
    blob = cache_lookup(cache_dir, entry.key)
    name = f"{i:02d}.cubin"
    with open(os.path.join(out_dir, name), "wb") as f:
        f.write(blob)
    index.append({"file": name, "kernels": entry.metadata.kernel_names,
                  "tma_store_not_selected": (entry.metadata.remarks or "").count(
                      "RemarkMemoryTmaStoreFailed")})
with open(os.path.join(out_dir, "index.json"), "w") as f:
    json.dump({"shapes": SHAPES, "cubins": index}, f, indent=1)
print(json.dumps(index, indent=1))
