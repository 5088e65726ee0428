"""The decode launcher: a few query rows per sequence against a dense or paged KV cache.

One launch of kernels/decode.py's ``decode`` (and of ``merge_splits`` when the cache is
split). Everything that depends only on shapes (the kernel with its hints, the constants,
the split count, the grids) is a ``DecodePlan``, made once per shape and split count and
looked up per shape key, so that a decoding step, which calls this per layer and token,
pays for a dictionary lookup, the output allocation and the launches. Nothing reads a device tensor on the host: a call
can be captured in a CUDA graph.
"""

import functools
from dataclasses import dataclass, field, replace

import cuda.tile as ct
import torch

from ..kernels import decode as kernels
from ..platforms import DecodeLaunch, entry_for
from ..platforms.entry import PADDED_HEAD_DIM_MULTIPLE, launch_head_dim, tile_head_dim
from .family import DECODE, MERGE_SPLITS, UNUSED_ARRAY, KeptArray
from .launcher import current_stream, device_facts, remember, sinks_argument, with_hints
from .variants import NO_VARIANTS, Variants

# Columns of the transposed products (group heads x query rows) are at least this many:
# the smallest N a warpgroup product takes.
MIN_COLUMNS = 8
# A CTA's columns are at most this many (its float32 accumulator is head dim x columns):
# more, a chunk of new tokens longer than speculative decoding's, are cut into tiles of
# this many, each its own CTA (kernels/decode.py's COLUMN_TILES).
CTA_COLUMNS = 128
# A paged cache's key tile spans at most this many blocks (kernels/decode.py).
MAX_BLOCKS_PER_TILE = 8
# A window side wider than this many keys reaches past every key of any cache (the
# variants' scalars; kernels/decode.py subtracts it from key indices, in int32).
WINDOW_REACH = 2 ** 30


def power_of_two_at_least(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@dataclass(frozen=True)
class DecodeShape:
    """What a decode launch depends on besides the tensors' addresses."""
    batch: int
    head_dim: int  # of the query and key_cache
    kv_heads: int
    group: int  # query heads per K/V head
    q_len: int
    capacity: int  # keys a sequence can have: the dense cache's length, or blocks x size
    block_size: int | None  # None: a dense cache
    causal: bool
    has_starts: bool  # keys start at a per-sequence index (left padding), not at 0
    has_lengths: bool
    write_lse: bool
    num_splits: int | None  # None: the platform's rule
    # softcap, sinks and a window whose right side the causal mask (or the last key) is;
    # None: none (not NO_VARIANTS: dynamo cannot build a default it has no source for)
    variants: Variants | None = None
    value_head_dim: int | None = None  # of value_cache and the output; None: head_dim

    @property
    def asked(self) -> Variants:
        return NO_VARIANTS if self.variants is None else self.variants

    @property
    def value_dim(self) -> int:
        return self.head_dim if self.value_head_dim is None else self.value_head_dim

    @property
    def launch_head_dim(self) -> int:
        """The head dim of the platform entry's decode launch this shape takes."""
        return launch_head_dim(self.head_dim, self.value_dim)


@dataclass
class DecodePlan:
    """One shape's launches on one device: the kernels, their grids and constants, and the
    split buffers per stream."""
    kernel: object
    hints: dict  # the compiler hints `kernel` was made with (DecodeLaunch.choose)
    grid: tuple[int, int, int]
    constants: dict
    merge_grid: tuple[int, int, int]
    merge_constants: dict
    split_buffer_shape: tuple[int, ...] | None  # (batch, kv_heads, splits, columns, D_v)
    device: torch.device
    variant_scalars: dict  # the variants' run-time arguments (Variants.scalars)
    # The merge launched programmatically (sm_90 and later): its CTAs start while the
    # splits run and wait on the GPU for them (kernels/decode.py), with no launch gap.
    early_merge: bool = False
    buffers_by_stream: dict = field(default_factory=dict)  # stream -> (Partial, PartialLse)
    settings_by_scale: dict = field(default_factory=dict)  # softmax scale -> settings

    @functools.cached_property
    def merge_settings(self) -> tuple:
        return MERGE_SPLITS.settings(self.merge_constants)

    def settings(self, scale: float) -> tuple:
        """The decode kernel's arguments after its arrays, for this softmax scale."""
        settings = self.settings_by_scale.get(scale)
        if settings is None:
            settings = DECODE.settings({"qk_scale": scale, **self.variant_scalars,
                                        **self.constants})
            self.settings_by_scale[scale] = settings
        return settings

    def split_buffers(self, stream: int, keep: bool) -> tuple:
        """(Partial, PartialLse) of launches on `stream`, float32 KeptArrays (each is
        passed to two launches): kept (see ``kept``), since launches on one stream run one
        after the other; UNUSED_ARRAY twice without a split."""
        if self.split_buffer_shape is None:
            return UNUSED_ARRAY, UNUSED_ARRAY

        def make():  # two allocations, no kernel (a clone would be one in a CUDA graph)
            return tuple(KeptArray(torch.empty(shape, dtype=torch.float32, device=self.device))
                         for shape in (self.split_buffer_shape, self.split_buffer_shape[:-1]))
        return kept(self.buffers_by_stream, stream, make, keep)


def kept(cache: dict, key, make, keep: bool):
    """cache[key], made by make() the first time and kept, but not where the allocation
    lands in a CUDA graph's memory pool: while the stream is capturing, or without `keep`
    (in the custom operator, which torch.compile's CUDA graphs run in their pool, where a
    tensor that outlives the graph's outputs counts as a leak)."""
    found = cache.get(key)
    if found is None:
        found = make()
        if keep and not torch.cuda.is_current_stream_capturing():
            cache[key] = found
    return found


def tile_of_columns(shape: DecodeShape, launch: DecodeLaunch) -> tuple[int, int]:
    """(query heads, query rows) of a CTA's columns: each a power of two, at least
    MIN_COLUMNS in all, padded where `launch` pads them (DecodeLaunch.query_rows)."""
    group_tile = power_of_two_at_least(shape.group)
    query_rows = max(power_of_two_at_least(shape.q_len), MIN_COLUMNS // group_tile, 1)
    return group_tile, launch.query_rows(group_tile, query_rows, shape.block_size,
                                         shape.has_starts)


def column_tiles(columns: int) -> int:
    """How many CTAs share `columns` columns (powers of two): CTA_COLUMNS each."""
    return max(columns // CTA_COLUMNS, 1)


def rule_splits(shape: DecodeShape, launch: DecodeLaunch, sms: int) -> int:
    """The splits `launch`'s rule gives `shape` on a GPU of `sms` SMs."""
    group_tile, query_rows = tile_of_columns(shape, launch)
    tiles = column_tiles(group_tile * query_rows)
    return launch.splits(shape.batch * shape.kv_heads * tiles, shape.capacity, sms,
                         columns=group_tile * query_rows // tiles, block_size=shape.block_size,
                         has_starts=shape.has_starts)


def kernel_window(shape: DecodeShape) -> tuple[bool, dict]:
    """(the kernel's CAUSAL, its variants' scalars) for `shape`. The kernel's window has
    the causal mask's right side, its diagonal moved `window_right` keys on: a window
    bounded on the right without a causal mask, over several query rows, runs as a causal
    one whose rows see `right` keys past their diagonals, `left + right` before the moved
    ones (one row sees every key to the last whatever its right side)."""
    scalars = shape.asked.scalars(q_rows=shape.q_len, k_rows=WINDOW_REACH, causal=True)
    window = shape.asked.window
    if shape.causal or shape.q_len == 1 or window is None or window[1] is None:
        return shape.causal, scalars
    right = min(window[1], WINDOW_REACH)
    return True, scalars | {"window_left": min(scalars["window_left"] + right, WINDOW_REACH),
                            "window_right": right}


def loaded_tail(head_dim: int) -> int:
    """The width of the second of K's two loads in the decode kernel for a head dim below
    its tile's (kernels/decode.py's D_TAIL): the first takes the tile's first half of the
    columns, this one, a power of two, the rest, zeros past it; 0 where the rest is past a
    quarter of the tile (a whole tile, 112 of 128) or none. Unlike the forward's
    ``split_head_dim``, which must cover the head dim exactly (its two products' steps),
    this only spares the TMA load its padded columns: 72 loads 64 + 8, 88 64 + 32."""
    half = tile_head_dim(head_dim) // 2
    rest = head_dim - half
    if not 0 < rest <= half // 2:
        return 0
    return max(power_of_two_at_least(rest), PADDED_HEAD_DIM_MULTIPLE)


def key_tail(shape: DecodeShape, queries_on_m: bool) -> int:
    """The decode kernel's D_TAIL: K's loads in two pieces (``loaded_tail``) in the
    transposed products of a dense cache or of blocks of 64 keys and more. There they took
    0.95-1.00x the time of one padded load (D 72-192, paged at batch 64 0.92-0.93x); in
    blocks of 16 1.06-1.17x at D=72 and 80 (H100, 2026-11-27: docs/performance.md,
    "K in pieces"). On the M side the loads are step 9's."""
    if queries_on_m or (shape.block_size is not None and shape.block_size < 64):
        return 0
    return loaded_tail(shape.head_dim)


def decode_plan(shape: DecodeShape, launch: DecodeLaunch, sms: int,
                device: torch.device, early_merge: bool = False) -> DecodePlan:
    """The launches of `shape` with `launch` (a platform entry's for its head dim), on a
    GPU with `sms` SMs; `early_merge`: see DecodePlan."""
    group_tile, query_rows = tile_of_columns(shape, launch)
    splits = shape.num_splits or rule_splits(shape, launch, sms)
    columns = group_tile * query_rows
    tiles = column_tiles(columns)
    queries_on_m, tile_n, hints = launch.choose(columns // tiles,
                                                shape.batch * shape.kv_heads * splits * tiles,
                                                sms, keys_per_split=shape.capacity // splits,
                                                block_size=shape.block_size,
                                                has_starts=shape.has_starts)
    if shape.block_size is not None:
        tile_n = min(tile_n, MAX_BLOCKS_PER_TILE * shape.block_size)
    common = {"TILE_DV": tile_head_dim(shape.value_dim), "QUERY_GROUP": shape.group,
              "QUERY_ROWS": query_rows, "WRITE_LSE": shape.write_lse}
    causal, variant_scalars = kernel_window(shape)
    constants = common | {"TILE_D": tile_head_dim(shape.head_dim), "TILE_N": tile_n,
                          "GROUP_TILE": group_tile, "CAUSAL": causal,
                          "PAGED": shape.block_size is not None,
                          "BLOCK_SIZE": shape.block_size or 1, "HAS_STARTS": shape.has_starts,
                          "HAS_LENGTHS": shape.has_lengths, "SPLIT": splits > 1,
                          "QUERIES_ON_M": queries_on_m, "COLUMN_TILES": tiles,
                          "D_TAIL": key_tail(shape, queries_on_m)} | \
        shape.asked.constants()
    merge_constants = common | {"SPLITS_TILE": power_of_two_at_least(splits)}
    sizes = {"batch": shape.batch, "kv_heads": shape.kv_heads, "q_len": shape.q_len,
             "splits": splits}
    return DecodePlan(
        kernel=with_hints(kernels.decode, hints), hints=hints,
        grid=DECODE.grid(sizes | {"COLUMN_TILES": tiles}),
        constants=constants, merge_grid=MERGE_SPLITS.grid(sizes | merge_constants),
        merge_constants=merge_constants,
        split_buffer_shape=(shape.batch, shape.kv_heads, splits, columns,
                            shape.value_dim) if splits > 1 else None,
        device=device,
        variant_scalars=variant_scalars,
        early_merge=early_merge)


# The plan of each shape key seen, at most this many (emptied when full): a DynamicCache
# grows by a key per decoding step, so each step brings a new capacity.
MAX_PLAN_KEYS = 4096
_PLANS: dict = {}


def _cached_plan(shape: DecodeShape, device: torch.device,
                 launch: DecodeLaunch | None) -> DecodePlan:
    """The plan of `shape`, made once per split count: of a cache's capacity a plan
    depends on that and which side of the one-wave launch's bound it is on
    (DecodeLaunch.long_capacity) alone, so the capacities of a growing cache share a few
    plans (and their split buffers) instead of making one per decoding step."""
    key = (shape, device, launch)
    plan = _PLANS.get(key)
    if plan is None:
        arch, sms = device_facts(device)
        launch = launch or entry_for(arch).decode[shape.launch_head_dim]
        splits = shape.num_splits or rule_splits(shape, launch, sms)
        capacity = launch.long_capacity(shape.capacity, splits)
        plan = _plan_of_splits(replace(shape, capacity=capacity, num_splits=splits), device,
                               launch, sms)
        remember(_PLANS, key, plan, MAX_PLAN_KEYS)
    return plan


@functools.cache
def _plan_of_splits(shape: DecodeShape, device: torch.device, launch: DecodeLaunch,
                    sms: int) -> DecodePlan:
    return decode_plan(shape, launch, sms, device,
                       early_merge=torch.cuda.get_device_capability(device) >= (9, 0))


# The arrays of the two launches as decode_forward has them (tuples, not dicts: a
# decoding step pays each microsecond of host time per layer), in the families' order.
_DECODE_ARRAYS = DECODE.tensors_from(("Q", "K", "V", "Out", "Lse", "Partial", "PartialLse",
                                      "KeyStarts", "KeyEnds", "BlockTable", "Sinks"))
_MERGE_ARRAYS = MERGE_SPLITS.tensors_from(("Partial", "PartialLse", "Out", "Lse"))


def decode_forward(q, key_cache, value_cache, shape: DecodeShape, *, scale: float,
                   key_starts=None, key_ends=None, block_table=None, sinks=None,
                   launch: DecodeLaunch | None = None, keep_buffers: bool = True):
    """(out, lse or None) of q (batch, heads, q_len, D) against the cache; `shape` says
    the rest (checked by the caller: cutile_fmha.kvcache). out is like q, with value_cache's
    head dim D_v; lse is (batch,
    heads, q_len) float32. key_starts/key_ends: int32 (batch,), where each sequence's keys
    start and end, when shape.has_starts/has_lengths; sinks: (heads,) under
    shape.asked.sinks. `launch`: another than this GPU's platform entry's (the
    autotuner's candidates). `keep_buffers`: False in the custom operator (see ``kept``)."""
    device = q.device
    out = torch.empty_like(q) if shape.value_head_dim is None else \
        q.new_empty((*q.shape[:-1], shape.value_head_dim))
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=device) if shape.write_lse \
        else UNUSED_ARRAY
    if not shape.batch:  # no sequence: nothing to launch (nor a split rule for no CTAs)
        return out, lse if shape.write_lse else None
    plan = _cached_plan(shape, device, launch)
    stream = current_stream(device)
    partial, partial_lse = plan.split_buffers(stream, keep_buffers)
    arrays = (q, key_cache, value_cache, out, lse, partial, partial_lse,
              UNUSED_ARRAY if key_starts is None else key_starts,
              UNUSED_ARRAY if key_ends is None else key_ends,
              UNUSED_ARRAY if block_table is None else block_table, sinks_argument(sinks))
    ct.launch(stream, plan.grid, plan.kernel, _DECODE_ARRAYS(arrays) + plan.settings(scale))
    if plan.split_buffer_shape is not None:
        ct.launch(stream, plan.merge_grid, kernels.merge_splits,
                  _MERGE_ARRAYS((partial, partial_lse, out, lse)) + plan.merge_settings,
                  programmatic_dependent_launch=plan.early_merge)
    return out, lse if shape.write_lse else None
