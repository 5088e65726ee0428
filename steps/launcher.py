"""The one launcher: validate inputs, pick the platform entry, size the grid, launch a step.

Everything that depends on shapes lives here, so each step's kernel is only the
algorithm. ``plan_launch`` does all the work up to the launch, the environment check
included (benchmarks time only ``LaunchPlan.launch``); ``attention`` is plan + launch.
The drop-in for ``scaled_dot_product_attention`` (``cutile_fmha.attention``) is built
on the same plan.
"""

import functools
import math
from dataclasses import dataclass, replace

import cuda.tile as ct
import torch

from ..platforms import (HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS, PlatformEntry, TileShape,
                         arch_of_capability, entry_for)
from ..platforms.entry import PADDED_HEAD_DIM_MULTIPLE, runs_on_padded_tiles, tile_head_dim
from ..platforms.environment import CHECK_COMMAND, require_environment
from .definitions import STEPS, fastest_step, steps_for
from .family import FORWARD_TENSORS, UNUSED_ARRAY, forward_constants

DTYPES = (torch.float16, torch.bfloat16)
MAX_GRID_YZ = 65535  # CUDA's limit on grid.y (heads) and grid.z (batch)
# causal=True means "top_left", SDPA's is_causal: query i sees keys 0..i. "bottom_right"
# aligns the diagonal with the last key (query i sees keys 0..i + k_len - q_len), as a
# KV-cache prefill, flash-attn and torch.nn.attention.bias.causal_lower_right do.
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")
# step="fastest": the step the autotuner measured fastest on this architecture for this
# head dim, causal or not (the guide's last step where it has not run).
FASTEST = "fastest"


@dataclass(frozen=True)
class LaunchPlan:
    kernel: object
    grid: tuple[int, int, int]
    args: tuple
    out: torch.Tensor | None  # None: a plan for launch_on alone (without_tensors)
    lse: torch.Tensor | None  # (batch, heads, q_len) float32, filled by launch(); or None
    entry: PlatformEntry
    tiles: TileShape
    step: int  # the step it runs (what step="fastest" chose)

    def launch(self) -> torch.Tensor:
        ct.launch(torch.cuda.current_stream(self.out.device), self.grid, self.kernel, self.args)
        return self.out

    def without_tensors(self) -> "LaunchPlan":
        """This plan for ``launch_on`` alone: a plan kept per shape must not keep its first
        call's tensors alive."""
        tensors = len(FORWARD_TENSORS)
        return replace(self, args=(None,) * tensors + self.args[tensors:],
                       out=None, lse=None)

    def launch_on(self, q, k, v, out, lse) -> None:
        """The same launch on other tensors of the same shapes, strides, dtypes and device
        (lse: UNUSED_ARRAY when it writes none), on the current stream."""
        ct.launch(current_stream(q.device), self.grid, self.kernel,
                  (q, k, v, out, lse) + self.args[len(FORWARD_TENSORS):])


@dataclass(frozen=True)
class Names:
    """What the caller calls the tensors, for error messages."""
    q: str = "q"
    k: str = "k"
    v: str = "v"
    out: str = "out"


@functools.cache
def _kernel_with_hints(kernel, hints: tuple):
    # One kernel object per (kernel, hints): each holds its own JIT cache.
    return kernel.replace_hints(**dict(hints))


def with_hints(kernel, hints: dict | None):
    """`kernel` with `hints` replaced (the same object for the same hints), or as
    decorated when `hints` is None."""
    return kernel if hints is None else _kernel_with_hints(kernel, tuple(sorted(hints.items())))


def kernel_for(step: int, hints: dict | None):
    """The step's kernel, with `hints` replaced when given."""
    return with_hints(STEPS[step].kernel, hints)


@functools.cache
def device_facts(device: torch.device) -> tuple[str, int]:
    """(architecture, SM count) of a CUDA device, looked up once, with the environment
    checked the first time."""
    require_environment(device.index)
    properties = torch.cuda.get_device_properties(device)
    return arch_of_capability(properties.major, properties.minor), \
        properties.multi_processor_count


@functools.cache
def _made_for_arch(make, arch: str, shape: tuple):
    return make(entry_for(arch), **dict(shape))


def on_device(make, device: torch.device, **shape):
    """make(the platform entry of `device`'s architecture, **shape), made once per
    architecture and shape (hashable values): a launcher's kernel and constants, which a
    decoding step asks for per layer and token."""
    return _made_for_arch(make, device_facts(device)[0], tuple(shape.items()))


def remember(cache: dict, key, value, limit: int):
    """cache[key] = value, `cache` emptied first when it holds `limit` keys: a cache of
    per-shape-key results, where a training loop over packed batches of ever new lengths,
    or a growing KV cache, brings a new key per call. Returns value."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = value
    return value


def current_stream(device: torch.device) -> int:
    """The device's current CUDA stream as the raw handle ct.launch takes (a fraction of
    torch.cuda.current_stream's cost, which a decoding step pays per layer)."""
    return torch._C._cuda_getCurrentRawStream(device.index)


def sinks_argument(sinks: torch.Tensor | None):
    """The Sinks argument the kernels take: float32 sinks (heads,), or UNUSED_ARRAY."""
    return UNUSED_ARRAY if sinks is None else sinks.float()


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


def rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself where its last dimension is contiguous (what the kernels need: other strides
    are free, so a transposed gradient needs no copy), else a contiguous copy."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_devices(named_tensors) -> None:
    """All on one CUDA device (checked last, so shape errors show on any machine)."""
    first_name, first = named_tensors[0]
    for name, t in named_tensors:
        if t.device.type != "cuda":
            hint = "" if torch.cuda.is_available() else \
                f"; no CUDA GPU is visible here (check with: {CHECK_COMMAND})"
            raise ValueError(f"{name} must be on a CUDA device, got {t.device}{hint}")
        if t.device != first.device:
            all_names = ", ".join(n for n, _ in named_tensors)
            raise ValueError(f"{all_names} must be on one device: {first_name} is on "
                             f"{first.device}, {name} is on {t.device}")


# The narrowest second column tile of Q and K (split_head_dim): a warpgroup product's step
# along its inner dimension in 16-bit inputs.
MIN_HEAD_DIM_TAIL = 16


def split_head_dim(head_dim: int) -> tuple[int, int]:
    """(TILE_D, TILE_D_TAIL) of Q and K for the forward on step 9's query tile: two
    power-of-two column tiles where they cover the head dim exactly (96 = 64 + 32, 80 = 64 +
    16, 160 = 128 + 32, 192 = 128 + 64), so that Q K^T runs on the head dim's own columns
    instead of padding to the next power of two (a quarter of D=96's 128 columns); else
    (``tile_head_dim``, 0)."""
    main = 1 << (head_dim.bit_length() - 1)
    tail = head_dim - main
    if head_dim <= HEAD_DIMS[-1] and tail >= MIN_HEAD_DIM_TAIL and tail & (tail - 1) == 0:
        return main, tail
    return tile_head_dim(head_dim), 0


def is_padded(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether q's and v's head dims need ``tile_head_dim``'s padding (not one of the
    dims every step runs, or value's not query's)."""
    return q.shape[-1] != v.shape[-1] or q.shape[-1] not in HEAD_DIMS + LARGE_HEAD_DIMS


def _check_shapes(q, k, v, n: Names, *, padded: bool = False, whole: bool = True,
                  empty: bool = False) -> None:
    """q, k, v as every kernel takes them; with `padded` (the kernels on step 9's query
    tile) also head dims that ``tile_head_dim`` pads, value's possibly not query's. Not
    `whole`: their 32-bit offsets unchecked, for a caller that launches groups of their
    heads (``HeadGroupLaunches``). With `empty`, batch, query heads and sequence lengths
    may be 0 (for a caller that then launches nothing)."""
    for name, t in ((n.q, q), (n.k, k), (n.v, v)):
        _check_tensor(name, t)
    for name, t in ((n.k, k), (n.v, v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{n.q}, {n.k} and {n.v} must share one dtype: {n.q} is {q.dtype}, "
                            f"{name} is {t.dtype}")
        for dim, what in ((0, "batch size"), (3, "head dim")):
            if t.shape[dim] != q.shape[dim] and not (padded and name == n.v and dim == 3):
                raise ValueError(f"{name} must match {n.q}'s {what}: {n.q} has shape "
                                 f"{tuple(q.shape)}, {name} has {tuple(t.shape)}")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise ValueError(f"{n.k} and {n.v} must have the same heads and sequence length, got "
                         f"shapes {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(f"{n.q}'s head count must be a multiple of {n.k}'s and {n.v}'s "
                         f"(grouped-query attention), got {q.shape[1]} and {k.shape[1]}")
    batch, heads, q_len, head_dim = q.shape
    if padded and is_padded(q, v):
        for name, dim in ((f"{n.q} and {n.k}", head_dim), (n.v, v.shape[-1])):
            if not runs_on_padded_tiles(dim):
                raise ValueError(
                    f"head dims must be one of {HEAD_DIMS + LARGE_HEAD_DIMS}, or multiples of "
                    f"{PADDED_HEAD_DIM_MULTIPLE} up to {HEAD_DIMS[-1]} (there {n.v}'s may "
                    f"differ from {n.q}'s), got {dim} for {name}")
    elif head_dim not in HEAD_DIMS + LARGE_HEAD_DIMS:
        raise ValueError(f"head dim (last dimension of {n.q}, {n.k}, {n.v}) must be one of "
                         f"{HEAD_DIMS + LARGE_HEAD_DIMS}, got {head_dim}" +
                         (f" (multiples of {PADDED_HEAD_DIM_MULTIPLE} up to {HEAD_DIMS[-1]} run "
                          f"in cutile_fmha.attention)" if head_dim <= HEAD_DIMS[-1] else ""))
    if not empty and min(batch, heads, q_len, k.shape[2]) < 1:
        raise ValueError(f"batch, heads and sequence lengths must be at least 1, got "
                         f"{n.q} {tuple(q.shape)}, {n.k} {tuple(k.shape)}")
    if batch > MAX_GRID_YZ or heads > MAX_GRID_YZ:
        raise ValueError(f"batch and heads must each be at most {MAX_GRID_YZ}, got "
                         f"batch={batch}, heads={heads}")
    for name, t in ((n.q, q), (n.k, k), (n.v, v)):
        if whole and past_32_bits(t):
            raise ValueError(f"{name} is too long for the kernels' 32-bit strides: heads x "
                             f"seq_len x head_dim and each stride must be at most {MAX_STRIDE} "
                             f"elements, got shape {tuple(t.shape)} (strides {t.stride()}); "
                             f"cutile_fmha.attention() runs the heads of (batch, heads, seq, "
                             f"D) memory in groups that fit, and the sequence can be split "
                             f"over GPUs with cutile_fmha.distributed.ring_attention")


# cuTile passes a tensor's strides as 32-bit integers.
MAX_STRIDE = 2 ** 31 - 1


def past_32_bits(t: torch.Tensor) -> bool:
    """Whether t's strides (those of dimensions of size 1 too: cuTile refuses them as well),
    or those of the outputs and gradients made in its layout (dense: none above heads x
    seq_len x head_dim), pass what cuTile takes."""
    per_batch = math.prod(t.shape[1:]) if t.shape[0] else 0  # no tensor op: backward's hot path
    return per_batch > MAX_STRIDE or any(stride > MAX_STRIDE for stride in t.stride())


def heads_per_launch(tensors, units: int) -> int | None:
    """The most of `units` head units (a divisor of it) whose rows in each of `tensors`,
    (tensor, its heads per unit) pairs, lie within 32-bit offsets of their first row on one
    batch entry; None where the tensors fit whole (``past_32_bits``) or no group fits (one
    head past 2^31 elements, or a (batch, seq, heads, D) layout: every head spans the whole
    sequence's memory)."""
    if not any(past_32_bits(t) for t, _ in tensors):
        return None
    for size in range(units, 0, -1):
        if units % size == 0 and all(
                sum((n - 1) * stride for n, stride in zip((size * per_unit,) + t.shape[2:],
                                                          t.stride()[1:])) < MAX_STRIDE
                for t, per_unit in tensors):
            return size
    return None


def kv_heads_per_launch(q, k, v) -> int | None:
    """``heads_per_launch`` in K/V heads, with their query heads: for q, k and v (and the
    outputs and gradients made in their layouts) past cuTile's 32-bit strides whole."""
    return heads_per_launch([(q, q.shape[1] // k.shape[1]), (k, 1), (v, 1)], k.shape[1])


def head_groups(batch: int, kv_heads: int, query_group: int, per_launch: int):
    """(query-side index, K/V-side index) of each launch's views, (batch, heads) slices of
    (batch, heads, ...) tensors: one batch entry and `per_launch` K/V heads (with their
    query heads, `query_group` a K/V head) at a time."""
    for b in range(batch):
        for head in range(0, kv_heads, per_launch):
            yield ((slice(b, b + 1), slice(head * query_group, (head + per_launch) * query_group)),
                   (slice(b, b + 1), slice(head, head + per_launch)))


def head_group_view(t: torch.Tensor, index) -> torch.Tensor:
    """t[index], one batch entry's group of heads (``head_groups``), each dimension of size 1
    strided by the extent of those after it (as if packed, where they are): cuTile refuses
    a stride past 32 bits even there, where it moves no address. A (heads,) tensor (the
    sinks) takes the group's heads alone."""
    view = t[index[-t.dim():]]
    strides = list(view.stride())
    for dim in reversed(range(view.dim() - 1)):
        if view.shape[dim] == 1:
            strides[dim] = 1 + sum((n - 1) * stride for n, stride
                                   in zip(view.shape[dim + 1:], strides[dim + 1:]))
    return view.as_strided(view.shape, strides)


def head_group_views(tensors: dict, per_launch: int | None, kv_heads: int,
                     query_group: int = 1, key_side=()) -> list[dict]:
    """What each launch takes of `tensors` (name -> tensor or scalar): `tensors` itself
    where `per_launch` is None (they fit whole), else per batch entry and group of
    `per_launch` K/V heads (``head_groups``) the views of its tensors (``head_group_view``;
    those named in `key_side` on the K/V heads, the others on their query heads)."""
    if per_launch is None:
        return [tensors]
    batch = next(t for t in tensors.values() if isinstance(t, torch.Tensor)).shape[0]
    return [{name: head_group_view(t, keys if name in key_side else rows)
             if isinstance(t, torch.Tensor) else t for name, t in tensors.items()}
            for rows, keys in head_groups(batch, kv_heads, query_group, per_launch)]


@dataclass(frozen=True)
class HeadGroupLaunches:
    """One group's plan launched per batch entry and group of K/V heads (with their query
    heads), on views: for tensors past cuTile's 32-bit strides whole whose head groups fit
    (``kv_heads_per_launch``). ``LaunchPlan.launch_on``'s interface."""
    plan: LaunchPlan
    kv_heads: int  # per launch

    def launch_on(self, q, k, v, out, lse) -> None:
        for group in head_group_views({"q": q, "k": k, "v": v, "out": out, "lse": lse},
                                      self.kv_heads, k.shape[1], q.shape[1] // k.shape[1],
                                      key_side=("k", "v")):
            self.plan.launch_on(**group)

    def without_tensors(self) -> "HeadGroupLaunches":
        return self


def checked_kv_heads_per_launch(q, k, v, names: Names, *, padded: bool = False) -> int | None:
    """q, k and v checked as the kernels take them (``_check_shapes``), and the K/V heads
    each launch takes (``kv_heads_per_launch``): None where they fit cuTile's 32-bit strides
    whole; a ValueError where neither they nor any group of their heads does."""
    _check_shapes(q, k, v, names, padded=padded, whole=False)
    per_launch = kv_heads_per_launch(q, k, v)
    if per_launch is None:  # whole, or no group fits: then the whole check says why
        _check_shapes(q, k, v, names, padded=padded)
    return per_launch


def build_head_group_plan(q, k, v, *, names: Names, **options) -> HeadGroupLaunches | None:
    """Where q, k or v pass cuTile's 32-bit strides whole but groups of their heads do not
    (``checked_kv_heads_per_launch``), ``build_plan``'s plan for one group, launched per
    group; None where they fit whole."""
    per_launch = checked_kv_heads_per_launch(q, k, v, names)
    if per_launch is None:
        return None
    group = q.shape[1] // k.shape[1]
    rows, keys = next(head_groups(1, per_launch, group, per_launch))
    plan = build_plan(head_group_view(q, rows), head_group_view(k, keys),
                      head_group_view(v, keys), names=names, **options)
    return HeadGroupLaunches(plan.without_tensors(), per_launch)


def causal_query_offset(causal, q_len: int, k_len: int) -> int | None:
    """The kernels' query_offset for `causal` (False, True, "top_left" or
    "bottom_right"), or None when not causal."""
    if causal is False:
        return None
    if causal is True or causal == "top_left":
        return 0
    if causal == "bottom_right":
        return k_len - q_len
    raise ValueError(f"causal must be False, True or one of {CAUSAL_ALIGNMENTS}, got {causal!r}")


def softmax_scale(scale, head_dim: int) -> float:
    """`scale`, checked, or SDPA's default 1/sqrt(head_dim)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    # The kernels take the row maximum before scaling, which needs scale > 0.
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite number or None, got {scale}")
    return float(scale)


def _check_step_and_platform(step, platform, head_dim: int) -> None:
    if step != FASTEST:
        if isinstance(step, bool) or not isinstance(step, int):
            raise TypeError(f"step must be an int, one of {sorted(STEPS)}, or {FASTEST!r}, "
                            f"got {type(step).__name__}")
        if step not in STEPS:
            raise ValueError(f"step must be one of {sorted(STEPS)} or {FASTEST!r}, got {step!r}")
        if head_dim not in STEPS[step].head_dims:
            raise ValueError(f"step {step} runs head dims {STEPS[step].head_dims}; at head dim "
                             f"{head_dim} the steps are {steps_for(head_dim)}")
    if not (platform is None or isinstance(platform, PlatformEntry) or platform == "default"
            or platform in PLATFORMS):
        raise ValueError(f"platform must be one of {sorted(PLATFORMS)}, 'default', a "
                         f"PlatformEntry or None, got {platform!r}")


def build_plan(q, k, v, *, causal, scale, step, platform, out, with_lse,
               names: Names = Names()) -> LaunchPlan:
    """plan_launch, naming the tensors as the caller does in its errors."""
    _check_shapes(q, k, v, names)
    if not (isinstance(causal, bool) or isinstance(causal, str)):
        raise TypeError(f"causal must be a bool or one of {CAUSAL_ALIGNMENTS}, got "
                        f"{type(causal).__name__}")
    batch, heads, q_len, head_dim = q.shape
    query_offset = causal_query_offset(causal, q_len, k.shape[2])
    scale = softmax_scale(scale, head_dim)
    _check_step_and_platform(step, platform, head_dim)
    if not isinstance(with_lse, bool):
        raise TypeError(f"with_lse must be a bool, got {type(with_lse).__name__}")
    named = [(names.q, q), (names.k, k), (names.v, v)]
    if out is not None:
        _check_tensor(names.out, out)
        if out.shape != q.shape or out.dtype != q.dtype:
            raise ValueError(f"{names.out} must have {names.q}'s shape and dtype "
                             f"({tuple(q.shape)}, {q.dtype}), got {tuple(out.shape)}, {out.dtype}")
        named.append((names.out, out))
    _check_devices(named)

    require_environment(q.device.index)
    device_arch = arch_of_capability(*torch.cuda.get_device_capability(q.device))
    entry = platform if isinstance(platform, PlatformEntry) else entry_for(platform or device_arch)
    causal = query_offset is not None
    if step == FASTEST:
        step = fastest_step(entry, head_dim, causal)
    if head_dim not in entry.tiles and entry.tuned_launch(head_dim, causal) is None:
        raise ValueError(f"platform entry {entry.arch} has no launch for head dim {head_dim}")
    tiles, hints = STEPS[step].launch_config(entry, native=entry is entry_for(device_arch),
                                             head_dim=head_dim, causal=causal)
    kernel = kernel_for(step, hints)
    if out is None:  # in q's layout: (batch, seq, heads, D) memory stays so, with no copy
        out = torch.empty_like(q)
    lse = torch.empty((batch, heads, q_len), dtype=torch.float32, device=q.device) \
        if with_lse else None
    values = {"Q": q, "K": k, "V": v, "Out": out,
              "Lse": lse if with_lse else UNUSED_ARRAY, "qk_scale": scale,
              "query_offset": query_offset or 0,
              **forward_constants(head_dim, tiles, query_group=heads // k.shape[1],
                                  causal=causal, write_lse=with_lse)}
    family = STEPS[step].family
    return LaunchPlan(kernel, family.grid(values), family.arguments(values), out, lse,
                      entry, tiles, step)


def plan_launch(q, k, v, *, causal: bool | str = False, scale: float | None = None,
                step: int | str = FASTEST, platform: str | PlatformEntry | None = None,
                out: torch.Tensor | None = None, with_lse: bool = False) -> LaunchPlan:
    """Validates the arguments and prepares one launch; see ``attention``.
    with_lse: also write each query row's log-sum-exp to ``plan.lse``."""
    return build_plan(q, k, v, causal=causal, scale=scale, step=step, platform=platform,
                      out=out, with_lse=with_lse)


def attention(q, k, v, *, causal: bool | str = False, scale: float | None = None,
              step: int | str = FASTEST, platform: str | PlatformEntry | None = None,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v with one of the tutorial's kernels.

    q: (batch, heads, q_len, D); k, v: (batch, kv_heads, k_len, D), kv_heads dividing
    heads (grouped-query attention: query head h reads K/V head h // (heads // kv_heads));
    float16 or bfloat16 on one CUDA device, last dimension contiguous; D 64, 128, 256
    (steps 1-9) or a multiple of 64 from 320 to 1024 but 832 (steps 10 and 11).
    causal: False; True or "top_left" (query i sees keys 0..i, SDPA's ``is_causal``);
        "bottom_right" (query i sees keys 0..i + k_len - q_len; rows that see no key give 0).
    scale: softmax scale, default 1/sqrt(D).
    step: which kernel (1 = basic ... 11), or "fastest": the one the autotuner measured
        fastest on this GPU's architecture for this head dim, causal or not (default).
    platform: take tile sizes and occupancy from another architecture's table entry
        ("sm_103", ...) or from a PlatformEntry of your own, instead of this GPU's.
    out: where to write the result (like q); a new tensor when None.
    """
    return plan_launch(q, k, v, causal=causal, scale=scale, step=step, platform=platform,
                       out=out).launch()
