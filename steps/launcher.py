"""The one launcher: validate inputs, pick the platform entry, size the grid, launch a step.

Everything that depends on shapes lives here, so each step's kernel is only the
algorithm. ``plan_launch`` does all the work up to the launch, the environment check
included (benchmarks time only ``LaunchPlan.launch``); ``attention`` is plan + launch.
"""

import functools
import math
from dataclasses import dataclass

import cuda.tile as ct
import torch

from ..platforms import HEAD_DIMS, PLATFORMS, PlatformEntry, TileShape, arch_of_capability, entry_for
from ..platforms.environment import CHECK_COMMAND, require_environment
from .definitions import FINAL_STEP, STEPS

DTYPES = (torch.float16, torch.bfloat16)
MAX_GRID_YZ = 65535  # CUDA's limit on grid.y (heads) and grid.z (batch)


@dataclass(frozen=True)
class LaunchPlan:
    kernel: object
    grid: tuple[int, int, int]
    args: tuple
    out: torch.Tensor
    entry: PlatformEntry
    tiles: TileShape

    def launch(self) -> torch.Tensor:
        ct.launch(torch.cuda.current_stream(self.out.device), self.grid, self.kernel, self.args)
        return self.out


def kernel_constants(head_dim: int, tiles: TileShape, causal: bool) -> tuple:
    """The kernel's compile-time parameters (TILE_D, TILE_M, TILE_N, CAUSAL)."""
    return head_dim, tiles.tile_m, tiles.tile_n, causal


@functools.cache
def _kernel_with_occupancy(step_number: int, occupancy: int):
    return STEPS[step_number].kernel.replace_hints(occupancy=occupancy)


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dimensions (batch, heads, seq_len, head_dim), "
                         f"got shape {tuple(t.shape)}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} must be float16 or bfloat16, got {t.dtype}")
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name}'s last dimension must be contiguous (stride 1), got strides "
                         f"{t.stride()}; pass {name}.contiguous()")


def _check_devices(named_tensors) -> None:
    """All on one CUDA device (checked last, so shape errors show on any machine)."""
    first_name, first = named_tensors[0]
    for name, t in named_tensors:
        if t.device.type != "cuda":
            hint = "" if torch.cuda.is_available() else \
                f"; no CUDA GPU is visible here (check with: {CHECK_COMMAND})"
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}{hint}")
        if t.device != first.device:
            raise ValueError(f"q, k, v and out must be on one device: {first_name} is on "
                             f"{first.device}, {name} is on {t.device}")


def _validate(q, k, v, causal, scale, step, platform, out) -> float:
    """Checks every argument; returns the softmax scale to use."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"q, k and v must share one dtype: q is {q.dtype}, {name} is {t.dtype}")
        for dim, what in ((0, "batch size"), (1, "head count"), (3, "head dim")):
            if t.shape[dim] != q.shape[dim]:
                raise ValueError(f"{name} must match q's {what}: q has shape {tuple(q.shape)}, "
                                 f"{name} has {tuple(t.shape)}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same sequence length, got {k.shape[2]} and "
                         f"{v.shape[2]}")
    batch, heads, q_len, head_dim = q.shape
    if head_dim not in HEAD_DIMS:
        raise ValueError(f"head dim (last dimension of q, k, v) must be one of {HEAD_DIMS}, "
                         f"got {head_dim}")
    if min(batch, heads, q_len, k.shape[2]) < 1:
        raise ValueError(f"batch, heads and sequence lengths must be at least 1, got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}")
    if batch > MAX_GRID_YZ or heads > MAX_GRID_YZ:
        raise ValueError(f"batch and heads must each be at most {MAX_GRID_YZ}, got "
                         f"batch={batch}, heads={heads}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, one of {sorted(STEPS)}, got {type(step).__name__}")
    if step not in STEPS:
        raise ValueError(f"step must be one of {sorted(STEPS)}, got {step!r}")
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    # The kernels take the row maximum before scaling, which needs scale > 0.
    elif not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number or None, got {scale}")
    if not (platform is None or isinstance(platform, PlatformEntry) or platform == "default"
            or platform in PLATFORMS):
        raise ValueError(f"platform must be one of {sorted(PLATFORMS)}, 'default', a "
                         f"PlatformEntry or None, got {platform!r}")
    named = [("q", q), ("k", k), ("v", v)]
    if out is not None:
        _check_tensor("out", out)
        if out.shape != q.shape or out.dtype != q.dtype:
            raise ValueError(f"out must have q's shape and dtype ({tuple(q.shape)}, {q.dtype}), "
                             f"got {tuple(out.shape)}, {out.dtype}")
        named.append(("out", out))
    _check_devices(named)
    return float(scale)


def plan_launch(q, k, v, *, causal: bool = False, scale: float | None = None,
                step: int = FINAL_STEP, platform: str | PlatformEntry | None = None,
                out: torch.Tensor | None = None) -> LaunchPlan:
    """Validates the arguments and prepares one launch; see ``attention``."""
    scale = _validate(q, k, v, causal, scale, step, platform, out)
    require_environment(q.device.index)
    device_arch = arch_of_capability(*torch.cuda.get_device_capability(q.device))
    entry = platform if isinstance(platform, PlatformEntry) else entry_for(platform or device_arch)
    step_def = STEPS[step]
    kernel = step_def.kernel
    # From step 5 the kernel's occupancy comes from the table for the GPU it is compiled
    # for; another architecture's entry must bring its own occupancy along.
    if step_def.uses_table_occupancy and entry is not entry_for(device_arch):
        kernel = _kernel_with_occupancy(step, entry.occupancy)

    batch, heads, q_len, head_dim = q.shape
    if head_dim not in entry.tiles:
        raise ValueError(f"platform entry {entry.arch} has no tile shape for head dim {head_dim}")
    tiles = entry.tile_for(head_dim)
    if out is None:
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
    grid = (math.ceil(q_len / tiles.tile_m), heads, batch)
    args = (q, k, v, out, scale) + kernel_constants(head_dim, tiles, causal)
    return LaunchPlan(kernel, grid, args, out, entry, tiles)


def attention(q, k, v, *, causal: bool = False, scale: float | None = None,
              step: int = FINAL_STEP, platform: str | PlatformEntry | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v with one of the tutorial's kernels.

    q: (batch, heads, q_len, D); k, v: (batch, heads, k_len, D); float16 or bfloat16 on
    one CUDA device, last dimension contiguous; D in (64, 128, 256).
    causal: query i sees keys 0..i (top-left aligned, as SDPA's ``is_causal``).
    scale: softmax scale, default 1/sqrt(D).
    step: which kernel (1 = basic ... 6 = all optimizations).
    platform: take tile sizes and occupancy from another architecture's table entry
        ("sm_103", ...) or from a PlatformEntry of your own, instead of this GPU's.
    out: where to write the result (like q); a new tensor when None.
    """
    return plan_launch(q, k, v, causal=causal, scale=scale, step=step, platform=platform,
                       out=out).launch()
