"""The shape of one platform-table entry."""

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

# Steps 1-9 hold the whole head dim on chip: 64, 128 or 256. Steps 10 and 11 tile it, for
# the multiples of 64 from 320 to 1024 but 832: 13 x 64 splits into no output slices wider
# than 64 and fits no CTA whole, and ran slower than SDPA's efficient backend (H100,
# docs/performance.md).
HEAD_DIMS = (64, 128, 256)
LARGE_HEAD_DIMS = tuple(d for d in range(320, 1025, 64) if d != 832)
SOURCES = ("guide", "measured", "unmeasured")

# Head dims the kernels on step 9's query tile (the variants', the variable-length ones
# and the backward) run by padding: any multiple of PADDED_HEAD_DIM_MULTIPLE up to
# HEAD_DIMS[-1], query/key and value possibly different (``tile_head_dim``).
PADDED_HEAD_DIM_MULTIPLE = 8  # 16 bytes in 16-bit elements: rows TMA can load


def tile_head_dim(head_dim: int) -> int:
    """The head-dim width of the kernels' tiles for a tensor's head dim: past HEAD_DIMS[-1]
    the head dim itself (steps 10-11 tile it), else the smallest of HEAD_DIMS as wide.
    Loads are zero past a tensor's last column and stores clipped to it, so the extra
    columns add zeros to the products and are never written: D=96 runs 128 columns, and
    D_qk=192 with D_v=128 runs Q and K on 256 and V on 128 (TILE_D and TILE_DV) at
    D=256's launch (``launch_head_dim``)."""
    if head_dim > HEAD_DIMS[-1]:
        return head_dim
    return next(d for d in HEAD_DIMS if d >= head_dim)


def runs_on_padded_tiles(head_dim: int) -> bool:
    """Whether the kernels that pad (``tile_head_dim``) run a tensor's head dim: a positive
    multiple of PADDED_HEAD_DIM_MULTIPLE up to HEAD_DIMS[-1]."""
    return 0 < head_dim <= HEAD_DIMS[-1] and head_dim % PADDED_HEAD_DIM_MULTIPLE == 0


def launch_head_dim(q_head_dim: int, v_head_dim: int) -> int:
    """The head dim whose platform-table launch (tiles, hints) a call takes: the wider of
    its two tile widths."""
    return max(tile_head_dim(q_head_dim), tile_head_dim(v_head_dim))


@dataclass(frozen=True)
class TileShape:
    tile_m: int  # query rows per CTA
    tile_n: int  # key/value rows per loop iteration
    # Steps 10-11 only (None: the whole head dim): head-dim columns of Q and K per product
    # of Q K^T, and output columns per CTA.
    tile_k: int | None = None
    tile_v: int | None = None


# The fewest columns of a key tile whose exponentials go to the FMA pipes together
# (TunedLaunch.fma_exp2): one 8-column group of the warpgroup product's accumulator layout.
MIN_FMA_EXP2_COLUMNS = 8


def is_power_of_two(n) -> bool:
    return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def fma_exp2_fits(share, tile_n: int) -> bool:
    """Whether one exponential in `share` (TunedLaunch.fma_exp2) can move to the FMA pipes
    in a key tile of `tile_n` columns: 0 (none), or a power of two from 2 that leaves
    MIN_FMA_EXP2_COLUMNS columns or more to move."""
    return share == 0 or (is_power_of_two(share) and 2 <= share <= tile_n // MIN_FMA_EXP2_COLUMNS)


@dataclass(frozen=True)
class TunedLaunch:
    """What the autotuner measured fastest on one GPU for one head dim, causal or not:
    the step, and the tiles and compiler hints every step from the first tuned one runs at."""
    step: int
    tiles: TileShape
    occupancy: int
    num_worker_warps: int | None = None  # None: the compiler's choice
    num_ctas: int | None = None  # None: the compiler's choice
    # The FP8 forward's only (kernels/fp8.py): one exponential in fma_exp2 of each unmasked
    # key tile computed on the FMA pipes, not by MUFU.EX2 (a power of two from 2 up to
    # tile_n / MIN_FMA_EXP2_COLUMNS; 0: none). A constant of the kernel, not a compiler hint.
    fma_exp2: int = 0

    def __post_init__(self):
        if not fma_exp2_fits(self.fma_exp2, self.tiles.tile_n):
            most = self.tiles.tile_n // MIN_FMA_EXP2_COLUMNS
            raise ValueError(f"fma_exp2 must be 0 or a power of two from 2 up to tile_n / "
                             f"{MIN_FMA_EXP2_COLUMNS} ({most}), got {self.fma_exp2!r}")

    def hints(self) -> dict:
        """The ``@ct.kernel`` hints, for ``kernel.replace_hints`` (None replaces the kernel's
        own value with the compiler's choice)."""
        return {"occupancy": self.occupancy, "num_worker_warps": self.num_worker_warps,
                "num_ctas": self.num_ctas}


@dataclass(frozen=True)
class DecodeLaunch:
    """The decode kernel's launch at one head dim (kernels/decode.py) and its split rule:
    the cache of each sequence is cut into as many splits as keep batch x kv_heads x splits
    CTAs within `ctas_per_sm` per SM (none when batch x kv_heads alone fill the SMs), with
    no split shorter than `min_keys_per_split` keys, at most `max_splits` of them, and none
    of a cache of at most `unsplit_keys` keys."""
    tile_n: int  # keys per loop iteration
    occupancy: int
    num_worker_warps: int | None
    ctas_per_sm: int
    min_keys_per_split: int
    max_splits: int = 64
    # A split call is two launches: the merge's costs the host about 7 us (H100, 2026-11-26),
    # more than a split saves the GPU on a cache of 512 keys (batch 1, 32/8 heads: 0.6 us at
    # D=128, 1.0 at 256, none at 64; unsplit, still 0.75-0.88x cuDNN's time there).
    unsplit_keys: int = 512
    # From this many columns (heads of a K/V head x query rows, rounded up to powers of two:
    # 128 is speculative decoding's 32 new tokens at 4 query heads a K/V head, or 16 at 8)
    # the launch takes `wide_occupancy` CTAs per SM and `wide_worker_warps` instead. At two
    # CTAs per SM and the compiler's warps the kernel spilled 0.8-3.4 KB a thread there (D
    # 64-256, sm_90); one CTA of eight worker warps spills 0-360 bytes and took 0.30-0.87x
    # the time (D 64-256, H200, 2026-11-27: docs/performance.md, "Speculative decoding").
    # At 64 columns and fewer it was not faster on every grid (see `one_wave_columns`).
    wide_columns: int = 128
    wide_occupancy: int = 1
    wide_worker_warps: int | None = 8
    # From this many columns (32: 8 new tokens at 4 query heads a K/V head, 4 at 8; None:
    # never; a power of two) up to `wide_columns`, where the products stay transposed
    # (paged caches with left padding, see `rows_padded_columns`), a grid of at most one
    # CTA per SM whose splits have at least `one_wave_keys` keys of the cache's capacity
    # takes the wide launch too, with tiles of `one_wave_tiles` keys: at this many
    # columns, twice as many, ... (tile_n past the tuple's end). At D=128 and 256 it spills nothing where the
    # table's launch spilled 8-416 bytes or had no producer warp (sm_90). At one wave it
    # took 0.60-0.96x the table's time at 32 columns and 0.59-0.88x at 64 (but 0.99-1.03x
    # at D=128 unsplit); at D=128 1.06-1.18x with splits of 512 keys and fewer (twice the
    # trips of 128-key tiles), 1.11-1.15x at two waves and more (D=256 at 32 columns:
    # 0.96x), and at D=64 1.13-1.25x on the table's tiles, 0.85-0.96x on 256-key ones from
    # splits of 2048 keys and 1.04-1.42x with splits of 512 keys and fewer (H200 and H100;
    # the H100 took 1.01-1.03x at D=128 and 32 columns; 2026-11-27: docs/performance.md,
    # "Speculative decoding"). At D=64 it serves 16 columns too (4 new tokens at 4 query
    # heads a K/V head): 0.87-0.95x the table's time at one wave, batch 1-16 (H100); at 8
    # columns the wide launch spills 1.2 KB and took 1.7-13x.
    one_wave_columns: int | None = None
    one_wave_tiles: tuple[int, ...] = ()
    one_wave_keys: int = 0
    # A paged cache takes the one-wave launch where its tile spans at most this many blocks
    # (8: as many as any tile may, steps/decode.py; D=64's 256-key tiles over 2-8 blocks
    # took 1.09-1.42x the table's time, H100).
    one_wave_blocks: int = 8
    # Where the one-wave launch would take a paged cache's grid but for its blocks (above),
    # the split rule aims at this many CTAs per SM instead of `ctas_per_sm` (None: the
    # same): the table's launch on one CTA per SM keeps too few loads in flight there. At
    # D=64 in blocks of 16 and 32, twice the splits took 0.73-0.94x the time at 16 columns
    # and 0.70-0.78x at 32 with left padding (but 1.07x at batch 16 x 4k), the one-wave
    # launch on 128-key tiles of 8 blocks 1.52-1.77x (H100, 2026-11-27:
    # docs/performance.md, "Speculative decoding").
    one_wave_refused_ctas_per_sm: int | None = None
    # From this many columns (None: never; a power of two, at least a warpgroup product's
    # 64 rows) a dense cache runs with the columns on the products' M side
    # (kernels/decode.py, QUERIES_ON_M: step 9's key loop), at `tile_n` and, below
    # `wide_columns`, the launch's own hints: the softmax then reduces along each thread's
    # rows, where the transposed products reduce across warps. At 64 and 128 columns it
    # took 0.65-0.95x and 0.33-0.64x the time of the launches before it (D 64-256, H100,
    # 2026-11-27: docs/performance.md, "Speculative decoding").
    rows_columns: int | None = None
    # A paged cache in blocks of at least this many keys (None: never; a power of two from
    # 16, the least block size) runs so too, at `tile_n`, its keys from the first (no left
    # padding: a block's rows before a sequence would count as keys); a tile of several
    # blocks is a load and a product per block. At 64 and 128 columns it took 0.42-0.93x
    # the time of the transposed products in blocks of 64-256; in blocks of 16 and 32,
    # tiles of one block took 0.51-0.86x, and these tiles 0.67-0.98x that again. Against
    # the dense cache: blocks of 64-256 1.00-1.06x (1.13x at D=64, 128 columns), 32
    # 1.02-1.05x, 16 1.03-1.33x (1.32-1.57x at D=64) (D 64-256, H100, 2026-11-27:
    # docs/performance.md, "Speculative decoding").
    rows_block_size: int | None = None
    # From this many columns (None: never; a power of two below `rows_columns`) up to
    # `rows_columns`, a launch pads its query rows to `rows_columns` columns where those
    # run on the M side: 8 new tokens at 4 query heads a K/V head are read as 16. The
    # padded rows gather zeros and write nothing; the cache is read once either way. At 32
    # columns it took 0.77-0.98x the transposed products' time from batch 16 or 32k keys
    # (D 64-128; dense 16 x 32k at 93% of the peak, paged in blocks of 16 at 89.5%), 1.03x
    # at batch 1 x 4k (0.4 us) and 0.995-1.008x at D=256 and batch 64 (H100, 2026-11-27:
    # docs/performance.md, "Speculative decoding").
    rows_padded_columns: int | None = None
    # A paged cache on the M side at `wide_columns` columns and more takes tiles of at most
    # this many blocks (None: `tile_n`'s, up to 8 blocks of 16). At 128 columns in blocks of
    # 16, 64-key tiles of 4 blocks took 0.93-0.99x the time of 128-key tiles of 8 (D 64 and
    # 128; the most, 0.93-0.96x, at batch 1), and spill nothing where 8 blocks spilled 8-24
    # bytes in the producer warp (H100, 2026-11-27: docs/performance.md, "Speculative
    # decoding"). Below `wide_columns` tiles of 8 blocks were the fastest.
    rows_wide_blocks: int | None = None

    def __post_init__(self):
        if self.one_wave_columns is not None and not is_power_of_two(self.one_wave_columns):
            raise ValueError(f"one_wave_columns must be None or a power of two (columns are "
                             f"powers of two), got {self.one_wave_columns!r}")
        if not isinstance(self.one_wave_tiles, tuple) or \
                not all(is_power_of_two(tile) for tile in self.one_wave_tiles):
            raise ValueError(f"one_wave_tiles must be a tuple of powers of two (keys per "
                             f"tile), got {self.one_wave_tiles!r}")
        self._check_positive("one_wave_refused_ctas_per_sm", "CTAs per SM", optional=True)
        self._check_positive("one_wave_blocks", "blocks a tile spans", optional=False)
        if self.rows_columns is not None and not (is_power_of_two(self.rows_columns) and
                                                  self.rows_columns >= 64):
            raise ValueError(f"rows_columns must be None or a power of two from 64 (a "
                             f"warpgroup product's rows), got {self.rows_columns!r}")
        if self.rows_padded_columns is not None and not (
                is_power_of_two(self.rows_padded_columns) and self.rows_columns is not None and
                self.rows_padded_columns < self.rows_columns):
            raise ValueError(f"rows_padded_columns must be None or a power of two below "
                             f"rows_columns ({self.rows_columns!r}), got "
                             f"{self.rows_padded_columns!r}")
        self._check_positive("rows_wide_blocks", "blocks a tile spans", optional=True)
        if self.rows_block_size is not None and not (is_power_of_two(self.rows_block_size) and
                                                     self.rows_block_size >= 16):
            raise ValueError(f"rows_block_size must be None or a power of two from 16 (keys a "
                             f"block holds), got {self.rows_block_size!r}")

    def _check_positive(self, name: str, what: str, optional: bool) -> None:
        """A ValueError unless field `name` (`what` it counts) is a positive int, or None
        where `optional`."""
        value = getattr(self, name)
        if not (optional and value is None or isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be {'None or ' if optional else ''}a positive int "
                             f"({what}), got {value!r}")

    def choose(self, columns: int, ctas: int, sms: int, keys_per_split: int,
               block_size: int | None = None,
               has_starts: bool = False) -> tuple[bool, int, dict]:
        """(whether the columns are the products' M side, the keys per tile, the compiler
        hints) of a launch of `columns` columns whose grid is `ctas` CTAs on a GPU of `sms`
        SMs, over splits of `keys_per_split` keys of the cache's capacity, in blocks of
        `block_size` keys (None: a dense cache), with keys from a per-sequence start or not
        (`has_starts`)."""
        wide = {"occupancy": self.wide_occupancy, "num_worker_warps": self.wide_worker_warps}
        own = {"occupancy": self.occupancy, "num_worker_warps": self.num_worker_warps}
        if self.queries_on_m(columns, block_size, has_starts):
            if columns < self.wide_columns:
                return True, self.tile_n, own
            tile_n = self.tile_n
            if block_size is not None and self.rows_wide_blocks is not None:
                tile_n = min(tile_n, self.rows_wide_blocks * block_size)
            return True, tile_n, wide
        if columns >= self.wide_columns:
            return False, self.tile_n, wide
        tile_n = self.one_wave_tile(columns, ctas, sms, keys_per_split)
        if tile_n is not None and (block_size is None or
                                   tile_n <= self.one_wave_blocks * block_size):
            return False, tile_n, wide
        return False, self.tile_n, own

    def one_wave_tile(self, columns: int, ctas: int, sms: int, keys_per_split: int) -> int | None:
        """The keys per tile of the one-wave launch of `columns` transposed columns on a
        grid of `ctas` CTAs over splits of `keys_per_split` keys, or None where the grid
        does not take it (a paged cache also needs blocks long enough: `choose`)."""
        if self.one_wave_columns is None or columns < self.one_wave_columns or \
                ctas > sms or keys_per_split < self.one_wave_keys:
            return None
        step = (columns // self.one_wave_columns).bit_length() - 1
        return self.one_wave_tiles[step] if step < len(self.one_wave_tiles) else self.tile_n

    def query_rows(self, group_tile: int, query_rows: int, block_size: int | None,
                   has_starts: bool) -> int:
        """The query rows of a launch of `group_tile` heads a K/V head and `query_rows` rows
        (powers of two) over a cache in blocks of `block_size` keys (None: dense), with
        keys from a per-sequence start or not: `query_rows`, or more to reach
        `rows_columns` columns (see `rows_padded_columns`)."""
        columns = group_tile * query_rows
        if self.rows_padded_columns is None or \
                not self.rows_padded_columns <= columns < self.rows_columns or \
                not self.queries_on_m(self.rows_columns, block_size, has_starts):
            return query_rows
        return self.rows_columns // group_tile

    def queries_on_m(self, columns: int, block_size: int | None,
                     has_starts: bool = False) -> bool:
        """Whether a launch of `columns` columns over a cache in blocks of `block_size` keys
        (None: dense), with keys from a per-sequence start or not, puts the columns on the
        products' M side."""
        if self.rows_columns is None or columns < self.rows_columns:
            return False
        return block_size is None or self.rows_block_size is not None and \
            block_size >= self.rows_block_size and not has_starts

    def long_capacity(self, capacity: int, splits: int) -> int:
        """The capacity a plan of `splits` splits is made for in place of `capacity`: the
        least that takes the one-wave launch where `capacity` reaches it, else 0. A plan
        depends on no more of the capacity, so those of a growing cache share at most two
        plans per split count."""
        least = splits * self.one_wave_keys
        return least if least and capacity >= least else 0

    def splits(self, ctas: int, keys: int, sms: int, columns: int = 0,
               block_size: int | None = None, has_starts: bool = False) -> int:
        """How many splits `ctas` CTAs (batch x kv_heads) take over `keys` keys each, for a
        launch of `columns` columns (0: not known) over a cache in blocks of `block_size`
        keys (None: dense), with keys from a per-sequence start or not."""
        if keys <= self.unsplit_keys:
            return 1
        splits = self._splits_at(self.ctas_per_sm, ctas, keys, sms)
        if self.one_wave_refused_ctas_per_sm is not None and block_size is not None and \
                columns < self.wide_columns and \
                not self.queries_on_m(columns, block_size, has_starts):
            tile_n = self.one_wave_tile(columns, ctas * splits, sms, keys // splits)
            if tile_n is not None and tile_n > self.one_wave_blocks * block_size:
                splits = self._splits_at(self.one_wave_refused_ctas_per_sm, ctas, keys, sms)
        return splits

    def _splits_at(self, ctas_per_sm: int, ctas: int, keys: int, sms: int) -> int:
        wanted = sms * ctas_per_sm // ctas
        return max(1, min(wanted, keys // self.min_keys_per_split, self.max_splits))


# Every entry's decode launch until the autotuner (--decode) measures one on its GPU: TMA
# tiles of 128 keys (64 at D=256, where a K or V tile is as many bytes), two CTAs per SM,
# splits up to one CTA per SM. What the autotuner does not search (the one-wave launch)
# its launches take from here.
DECODE_GUESS = {64: DecodeLaunch(128, 2, None, 1, 256, one_wave_columns=16,
                                 one_wave_tiles=(256, 256, 256), one_wave_keys=2048,
                                 one_wave_blocks=1, one_wave_refused_ctas_per_sm=2,
                                 rows_columns=64, rows_block_size=16, rows_padded_columns=32,
                                 rows_wide_blocks=4),
                128: DecodeLaunch(128, 2, None, 1, 256, one_wave_columns=32,
                                  one_wave_tiles=(64,), one_wave_keys=1024, rows_columns=64,
                                  rows_block_size=16, rows_padded_columns=32,
                                  rows_wide_blocks=4),
                256: DecodeLaunch(64, 2, None, 1, 256, one_wave_columns=32,
                                  one_wave_tiles=(64,), rows_columns=64, rows_block_size=16,
                                  rows_padded_columns=32, rows_wide_blocks=4)}


@dataclass(frozen=True)
class PlatformEntry:
    arch: str  # "sm_90", or "default"
    gpus: str  # the GPUs this entry is for, in words
    tiles: dict[int, TileShape]  # head dim -> tile shape of the guide's steps
    occupancy: int  # target CTAs per SM, given to the compiler from step 5 on
    source: Literal["guide", "measured", "unmeasured"]
    note: str  # where the numbers come from (device and date when measured)
    # Warps per CTA given to the compiler from step 7 on (num_worker_warps); None: its choice.
    worker_warps: int | None = None
    # (head dim, causal) -> the autotuner's result on this architecture (platforms/tuned/).
    tuned: dict[tuple[int, bool], TunedLaunch] = field(default_factory=dict)
    tuned_note: str = ""  # where the tuned launches were measured (device, date, versions)
    # The launch past D=256 (step 10 or 11) where the autotuner has not measured one; its
    # tile_v is the widest output slice one CTA takes (see large_head_dim_launch).
    large_head_dim: TunedLaunch | None = None
    # (head dim, causal) -> the autotuner's launch of the variable-length forward (step 9's
    # query tile over packed sequences); where it has not run, the dense step's launch.
    varlen_tuned: dict[tuple[int, bool], TunedLaunch] = field(default_factory=dict)
    # (head dim, causal) -> the autotuner's launch of the FP8 forward (kernels/fp8.py, step
    # 9's loop on float8 inputs); where it has not run, step 9's launch.
    fp8_tuned: dict[tuple[int, bool], TunedLaunch] = field(default_factory=dict)
    # head dim -> the decode kernel's launch and split rule.
    decode: dict[int, DecodeLaunch] = field(default_factory=lambda: dict(DECODE_GUESS))
    decode_note: str = "not measured: DECODE_GUESS (platforms/entry.py)"

    def tile_for(self, head_dim: int) -> TileShape:
        return self.tiles[head_dim]

    def tuned_launch(self, head_dim: int, causal: bool) -> TunedLaunch | None:
        """The autotuner's launch at (head_dim, causal); past D=256 without one, the
        entry's rule's (large_head_dim_launch); else None."""
        tuned = self.tuned.get((head_dim, causal))
        if tuned is None and head_dim in LARGE_HEAD_DIMS and self.large_head_dim:
            return self.large_head_dim_launch(head_dim)
        return tuned

    def large_head_dim_launch(self, head_dim: int) -> TunedLaunch:
        """Step 10's launch at `head_dim` from the entry's rule: its tiles and hints, and
        as output slice the widest multiple of 64 that divides `head_dim` and is at most
        the rule's widest (fewest CTAs per query tile, so the least recomputed Q K^T)."""
        rule = self.large_head_dim
        slice_width = max(width for width in range(64, rule.tiles.tile_v + 1, 64)
                          if head_dim % width == 0)
        return dataclasses.replace(rule, tiles=dataclasses.replace(rule.tiles,
                                                                   tile_v=slice_width))

    def describe(self) -> str:
        tuned = f"; tuned: {self.tuned_note}" if self.tuned else ""
        return f"{self.arch} ({self.gpus}), {self.source}: {self.note}{tuned}"
