import sys
sys.path.insert(0, "/work/main/.scratch/batched")
import pipe
from cutile_fmha.steps.compile import sass, resource_usage
for name in ("plain", "piped"):
    for D, M, N, hints in [(128, 128, 128, {"occupancy": 1, "num_worker_warps": 8}),
                           (128, 64, 128, {"occupancy": 2, "num_worker_warps": None}),
                           (64, 128, 64, {"occupancy": 2, "num_worker_warps": 8}),
                           (64, 128, 128, {"occupancy": 1, "num_worker_warps": 8})]:
        cb = pipe.cubin(pipe.hinted(pipe.KERNELS[name], hints), D, M, N)
        t = sass(cb)
        print(name, D, M, N, hints, pipe.counts(t), resource_usage(cb).strip().splitlines()[-1][:42], flush=True)
