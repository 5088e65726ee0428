"""The backward pass's launches (kernels/backward.py), per architecture, as data.

Per head dim, the tile shape and worker warps of the dK/dV kernel and of the dQ kernel,
and where it pays, of "dkdv_dq": the dK/dV kernel that also adds dQ with float32 atomics
(ATOMIC_DQ), run instead of the two for every call or for the calls its ``only_with`` and
``up_to_query_group`` name. Only sm_90 has been looked at; every other architecture gets
sm_90's launches, marked unmeasured. Where the autotuner has searched them (``python
assets/fmha_autotune.py --backward``), platforms/tuned/<arch>-backward.json's launches
replace these: "dkdv" and "dq" whole, "dkdv_dq" its tiles and worker warps (which calls it
runs for stays the table's), per head dim and per exact head-dim pair (192/128).
"""

import functools
from dataclasses import dataclass, field, replace

from .entry import HEAD_DIMS, TileShape, launch_head_dim
from .tuned import launch_order, load_launches, tuned_path

KERNELS = ("dkdv", "dq")  # the two kernels
SEARCHED = KERNELS + ("dkdv_dq",)  # the launches the autotuner searches


@dataclass(frozen=True)
class BackwardLaunch:
    tiles: TileShape  # TILE_M query rows x TILE_N keys
    num_worker_warps: int | None  # None: the compiler's choice
    # Tiles with the softcap where `tiles` spill (None: `tiles`): "dkdv_dq" at D=64.
    softcap_tiles: TileShape | None = None
    # "dkdv_dq" only: the calls it runs for, by what they have (ATOMIC_DQ_FEATURES: a
    # softcap, a window, Q's and K's columns split in two tiles, no causal mask, a
    # variable-length batch); None: every call.
    only_with: frozenset[str] | None = None
    # "dkdv_dq" with only_with: also every call with at most this many query heads to a K/V
    # head (0: none of them for that alone).
    up_to_query_group: int = 0
    # The head dims whose Q and K columns run as the forward's two tiles (96 = 64 + 32,
    # 192 = 128 + 64: steps/launcher.py's split_head_dim); the others pad to the next tile.
    # The two kernels pad 144-192 (tileiras 13.5 waits after every HGMMA of their split
    # dK/dV); "dkdv_dq" at D=256 splits 192, where it pays, and pads 160, where it does not.
    split_head_dims: frozenset[int] = frozenset({48, 80, 96})
    # "dkdv_dq" without the causal mask or a window, on a dense batch: each CTA's loop runs
    # over every query tile, and where a K/V head has at least 4x this many query rows
    # (q_len x its query heads) the call runs its queries in chunks of this many rows per
    # K/V head, the kernel adding their dK/dV to float32 sums (steps/backward.py's
    # query_chunk_rows). None: in one launch.
    chunk_query_rows: int | None = None
    # "dkdv_dq" only: each pair's dQ added one turn late, after the next pair's dK and dV
    # products (kernels/backward.py's DQ_LATE). It paid at D=128's 64x128 tiles; at D=64
    # (128x128, where the carried dS^T spills, and 64x128) and D=256 it was slower.
    dq_late: bool = False


# What a call may have that decides whether "dkdv_dq" runs for it (BackwardLaunch.only_with).
ATOMIC_DQ_FEATURES = frozenset({"softcap", "window", "split", "non-causal", "varlen"})


@dataclass(frozen=True)
class BackwardEntry:
    # head dim -> "dkdv" / "dq" [/ "dkdv_dq"] -> launch
    launches: dict[int, dict[str, BackwardLaunch]]
    provenance: str
    # (D_qk, D_v) -> kernel -> launch, over the head dim's for calls of exactly those head
    # dims (DeepSeek's MLA, 192/128: its V fits tiles that D=256's would spill).
    exact_launches: dict[tuple[int, int], dict[str, BackwardLaunch]] = field(
        default_factory=dict)


SM_90 = BackwardEntry(
    launches={
        64: {"dkdv": BackwardLaunch(TileShape(64, 128), 8),
             "dq": BackwardLaunch(TileShape(128, 64), 8),
             "dkdv_dq": BackwardLaunch(TileShape(128, 128), 8,
                                       softcap_tiles=TileShape(64, 128))},
        128: {"dkdv": BackwardLaunch(TileShape(32, 128), 8),
              "dq": BackwardLaunch(TileShape(128, 64), 8),
              "dkdv_dq": BackwardLaunch(TileShape(64, 128), 8, only_with=ATOMIC_DQ_FEATURES,
                                        up_to_query_group=4, chunk_query_rows=16384,
                                        dq_late=True)},
        256: {"dkdv": BackwardLaunch(TileShape(64, 64), 8),
              "dq": BackwardLaunch(TileShape(128, 32), 8),
              "dkdv_dq": BackwardLaunch(TileShape(64, 64), 8, split_head_dims=frozenset({192}))},
    },
    exact_launches={(192, 128): {"dkdv_dq": BackwardLaunch(
        TileShape(32, 128), 8, split_head_dims=frozenset({192}))}},
    provenance="Timed per kernel on an NVIDIA H100 80GB HBM3, 2026-11-22, tileiras 13.5 "
               "(B=4, H=32, 16 at D=256, N=8192, fp16; medians of 3 rounds; ms causal / "
               "not; docs/performance.md). dK/dV: D=64 64x128 4.81 / 9.60 against 128x128 "
               "5.20 / 10.06; D=128 64x128 8.71 / 16.87 against 128x64 10.46 / 19.86 and "
               "128x128 10.49 / 20.54; D=256 64x64 10.53 causal (before dK/dV turned to keys "
               "x queries tiles: 9.77 / 18.90, and 30.3 / 49.3 with four warps). dQ: D=64 "
               "128x64 3.22 / 6.29 against 128x128 3.80 / 7.09 and 64x64 6.51 / 12.63; "
               "D=128 128x64 5.35 / 10.41 against 128x128 6.30 / 11.59 and 64x64 9.63 / "
               "18.82; D=256 64x64 8.43 / 16.34 against 64x128 70.1 / 135.3. All with eight "
               "worker warps. D=256 dQ since 2026-11-24: 128x32, the whole backward (B=4, "
               "H=16, N=8192, bf16, H100) 16.0 / 30.4 ms against 17.8 / 33.4 with 64x64 under "
               "tileiras 13.4, 15.9 / 30.6 against 18.7 / 36.0 under 13.5, which waits after "
               "every HGMMA of the 64x64 dQ (docs/performance.md). D=128 dK/dV since 2026-11-24: "
               "32x128, the whole backward (bf16, H100, tileiras 13.4, same gradients) 2.2-3.5% "
               "faster causal (B=4, H=32, N=4096 / 8192 / 16384: 3.71 / 13.74 / 52.19 ms "
               "against 3.79 / 14.11 / 54.08; the Llama demo's B=4, H=16/4, N=2048: 0.596 "
               "against 0.615) and level non-causal (N=4096 / 8192: 6.81 / 26.20 against "
               "6.80 / 26.30); at D=64 32x128 is 15-17% slower. Q's and K's columns split "
               "up to D=128 only (2026-11-24, H100, B=4 H=32 N=8192 bf16): split, D=96 ran "
               "1.6-2% faster under tileiras 13.4 and 13.5; 192/128 ran 6% faster causal under "
               "13.4 but 6% (causal) and 12% slower under 13.5, which waits after every HGMMA "
               "of the split dK/dV there (docs/performance.md). dkdv_dq since 2026-11-26 (H100, "
               "bf16, tileiras 13.4; the whole backward against the two kernels, CUDA graphs, "
               "3 rounds): D=64 128x128 at B=4, H=32, N=4096-16384 0.82-0.87x their time "
               "(0.99-1.06x cuDNN's speed), and 0.84-0.89x at 256-2048 CTAs (B=1-8, 8-32 "
               "heads, GQA); with the softcap it spills at 128x128 (causal: 1.16x the two kernels' "
               "time), 64x128 0.72x. D=256 64x64 0.87-0.92x (1.05-1.15x cuDNN's speed; "
               "searched on 2026-11-26, H100, tileiras 13.4, B=4, H=16, N=4096, bf16: 3.65 / "
               "6.70 ms causal / not; every other launch took 2.5x its time or more, and every "
               "other tile shape spills), "
               "0.77-0.96x at 256-1024 CTAs. At D=128 64x128 took 0.96-0.97x the two kernels' "
               "time at B=1-4, H=32, N=4096-8192 but 1.01-1.15x with 4-8 query heads to a K/V "
               "head (B=2-8, H=16-32, N=2048-4096, the Llama demo's included), so D=128 "
               "runs it for calls with at most 2 query heads to a K/V head (H100, bf16, "
               "2026-11-26, against the two kernels: 0.88-0.99x their time at B=1-8, H=16-32, "
               "N=2048-16384, causal and not, fp16 0.95-0.96x, 32/16 heads 0.95-0.97x; 1.03x "
               "at B=4, H=32, N=1024 causal, taken), for calls without the causal mask (H100, "
               "bf16 and fp16, 2026-11-26, with 4-8 query heads to a K/V head: 0.88-0.99x the "
               "two kernels' time at B=1-8, H=16-64, N=1024-16384; causal 0.98-1.01x), for "
               "packed batches (same day, 4-8 query heads to a K/V head: 0.71-0.72x without "
               "the mask, 0.77-0.86x causal) and for calls with a softcap, a window or split "
               "Q/K columns (D=80, 96) "
               "(H200, bf16, 2026-11-26, 64x128 against the two kernels: softcap 30 "
               "0.85-0.90x at B=4, H=32 or 32/8, N=4096-8192, 1.01x at the Llama demo's "
               "shape; window 4096 at N=8192 0.93x, 0.98x with 32/8 heads; D=96 0.84-0.90x, "
               "0.92-0.93x cuDNN's speed). dkdv_dq at D=256 splits D_qk=192 as 128 + 64 (H100, "
               "2026-11-26, B=4, H=32, N=8192, bf16, against padded to 256 on the same 64x64 "
               "tiles): 192/128 0.86 / 0.89x the time causal / not (0.86x at B=2, H=16, "
               "N=4096), 192/192 0.90 / 0.92x; 160 = 128 + 32 took 1.03 / 1.09x, so 160 pads. "
               "192/128 on 32x128 tiles (its V's 128 columns leave the registers for them; "
               "at 192/192 and 160 they spill 500 bytes): 0.88 / 0.86x the 64x64 split's "
               "time (H100, same shape; 0.88-0.94x at B=1-2, H=16, N=4096-16384), 0.86-0.89x "
               "cuDNN's speed causal, 1.39x not. dkdv_dq at D=128 without the causal mask in "
               "chunks of 16384 query rows per K/V head from 65536 (H200, 2026-11-26, "
               "tileiras 13.4, bf16, B=1): in one launch 443 TFLOPS at 32k x 32k queries x "
               "keys, 414 at 64k x 64k, 374 at 128k x 128k, where Nsight Compute read the "
               "dK/dV kernel's L2 hit rate falling from 97.7% to 32.8% and its DRAM reads "
               "from 3.6 GB to 3.36 TB; in chunks 0.80x the one launch's time at 128k x 128k, "
               "0.89x at 64k x 64k, 0.92x at 128k x 16k and with 32/8 heads at 32k x 32k, "
               "level at 16k x 128k (not chunked). D=64 and 256 lost in chunks (1.02x and "
               "1.50x at 64k x 64k) and keep one launch. D=80-112 run D=128's launch: "
               "in chunks 1.02x the time at D=80, 1.00x at 96 (both on split columns, "
               "which keep one launch), 0.80-0.88x at 112 (H200, 2026-11-27). The sums "
               "added by the kernel (ADD_TO_DKDV, 2026-11-27): "
               "1.00x the time of adding them apart at 64k and 128k, 4 GiB less at 128k. "
               "dq_late at D=128 since 2026-11-28 (H100, bf16, tileiras 13.4, the whole "
               "dkdv_dq backward against its dQ on time, 5 rounds): 0.865-0.914x the time at "
               "B=2-4, H=32, N=4096-8192, causal and not, 0.866-0.896x with 2-4 query heads "
               "to a K/V head; D=64 1.05-1.09x (the carried dS^T spills) and D=256 "
               "1.01-1.03x, so off there. With it, up_to_query_group 4 (was 2): dkdv_dq "
               "against the two kernels, causal, 0.89-0.99x with 4 query heads to a K/V head "
               "(B=1-4, N=2048-8192), with 8 0.94x (B=1, H=64, N=8192) and 1.015x (B=4, H=32, "
               "N=4096). docs/performance.md.",
)
BACKWARD_ENTRIES = {"sm_90": SM_90}
DEFAULT_BACKWARD = BackwardEntry(SM_90.launches, "unmeasured: sm_90's launches")


def backward_record(key: tuple, launch: BackwardLaunch) -> dict:
    """One backward launch as the tuned JSON file stores it; `key` is (head dim, kernel),
    or ((D_qk, D_v), kernel) for an exact head-dim pair's."""
    head_dims, kernel = key
    dims = {"head_dim": head_dims[0], "value_head_dim": head_dims[1]} \
        if isinstance(head_dims, tuple) else {"head_dim": head_dims}
    late = {"dq_late": launch.dq_late} if kernel == "dkdv_dq" else {}
    return dims | {"kernel": kernel, "tile_m": launch.tiles.tile_m,
                   "tile_n": launch.tiles.tile_n, "num_worker_warps": launch.num_worker_warps,
                   **late}


def _backward_launch(record: dict, where: str) -> tuple[tuple, BackwardLaunch]:
    missing = [key for key in ("head_dim", "kernel", "tile_m", "tile_n", "num_worker_warps")
               if key not in record]
    if missing:
        raise ValueError(f"{where}: a backward launch lacks {missing}: {record}")
    if "value_head_dim" in record:  # an exact head-dim pair's
        head_dims = (record["head_dim"], record["value_head_dim"])
        valid = is_exact_pair(head_dims)
    else:
        head_dims = record["head_dim"]
        valid = head_dims in HEAD_DIMS
    if not valid or record["kernel"] not in SEARCHED:
        raise ValueError(f"{where}: head_dim must be one of {HEAD_DIMS} (or with "
                         f"value_head_dim, two head dims up to {HEAD_DIMS[-1]} other than "
                         f"those) and kernel one of {SEARCHED}: {record}")
    return (head_dims, record["kernel"]), BackwardLaunch(
        TileShape(record["tile_m"], record["tile_n"]), record["num_worker_warps"],
        dq_late=record.get("dq_late", False))


def head_dim_pair(head_dims) -> tuple[int, int]:
    """(D_qk, D_v) of a head dim or of an exact head-dim pair."""
    return head_dims if isinstance(head_dims, tuple) else (head_dims, head_dims)


def describe_head_dims(head_dims) -> str:
    """"128", or for an exact head-dim pair "192/128"."""
    return "{}/{}".format(*head_dims) if isinstance(head_dims, tuple) else str(head_dims)


def is_exact_pair(head_dims: tuple[int, int]) -> bool:
    """Whether (D_qk, D_v) can have launches of its own (BackwardEntry.exact_launches): two
    head dims the backward runs, not one of HEAD_DIMS twice (that is the head dim's)."""
    q_head_dim, v_head_dim = head_dims
    return all(1 <= d <= HEAD_DIMS[-1] for d in head_dims) and not (
        q_head_dim == v_head_dim and q_head_dim in HEAD_DIMS)


def with_launches(entry: BackwardEntry, launches: dict, provenance: str) -> BackwardEntry:
    """`entry` with `launches` ((head dim, kernel) -> launch, or ((D_qk, D_v), kernel) for
    an exact head-dim pair) in place of its own: for "dkdv_dq", which `entry` must have
    there (a pair: its own or its launch head dim's), their tiles, worker warps and dq_late
    only (the calls it runs for, its softcap tiles and split head dims stay `entry`'s)."""
    merged = {head_dim: dict(kernels) for head_dim, kernels in entry.launches.items()}
    exact = {pair: dict(kernels) for pair, kernels in entry.exact_launches.items()}
    for (head_dims, kernel), launch in launches.items():
        if isinstance(head_dims, tuple):
            table = merged[launch_head_dim(*head_dims)] | exact.get(head_dims, {})
            into = exact.setdefault(head_dims, {})
        else:
            table = into = merged[head_dims]
        if kernel in KERNELS:
            into[kernel] = launch
        elif kernel not in table:
            raise ValueError(f"D={describe_head_dims(head_dims)} has no {kernel!r} launch for "
                             f"{launch} to retile")
        else:
            into[kernel] = replace(table[kernel], tiles=launch.tiles,
                                   num_worker_warps=launch.num_worker_warps,
                                   dq_late=launch.dq_late)
    return replace(entry, launches=merged, exact_launches=exact, provenance=provenance)


@functools.cache
def backward_entry_for(arch: str) -> BackwardEntry:
    """`arch`'s backward launches, the autotuner's where it has run there."""
    entry = BACKWARD_ENTRIES.get(arch, DEFAULT_BACKWARD)
    path = tuned_path(arch, backward=True)
    if not path.exists():
        return entry
    launches, note = load_launches(arch, path, _backward_launch)
    searched = ", ".join(f"D={describe_head_dims(d)} {kernel}"
                         for d, kernel in sorted(launches, key=launch_order))
    return with_launches(entry, launches, f"{searched}: {note}; the others: "
                                          f"{entry.provenance}")
