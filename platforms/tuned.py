"""The autotuner's results: JSON files per architecture in platforms/tuned/.

``python assets/fmha_autotune.py`` writes ``tuned/<arch>.json`` (head dims 64-256),
``tuned/<arch>-large-head-dims.json`` (steps 10-11, past 256), with --varlen
``tuned/<arch>-varlen.json`` (the variable-length forward) and with --decode
``tuned/<arch>-decode.json`` (the decode kernel's launch and split rule per head dim), on a
GPU of that architecture:
where and with what it measured, the fastest launch per head dim and causal or not (the
step, its tiles and compiler hints), and the whole search table. The platform table reads
them, so the launcher runs the tuned steps at those tiles and hints and the drop-in runs
the fastest step.
"""

import dataclasses
import json
from pathlib import Path

from .entry import DECODE_GUESS, HEAD_DIMS, LARGE_HEAD_DIMS, DecodeLaunch, TileShape, TunedLaunch

TUNED_DIR = Path(__file__).with_name("tuned")
CONTEXT_KEYS = ("gpu", "date", "cuda_tile", "tileiras", "torch", "shape")
LAUNCH_KEYS = ("head_dim", "causal", "step", "tile_m", "tile_n", "occupancy",
               "num_worker_warps", "num_ctas")
TILED_HEAD_DIM_KEYS = ("tile_k", "tile_v")  # steps 10-11's launches also have these
DECODE_KEYS = ("head_dim",) + tuple(field.name for field in dataclasses.fields(DecodeLaunch))
# What a decode record must hold; the others, which the autotuner does not search (a record
# written before they existed lacks them), take the launch's defaults.
REQUIRED_DECODE_KEYS = ("head_dim",) + tuple(
    field.name for field in dataclasses.fields(DecodeLaunch)
    if field.default is dataclasses.MISSING)


def tuned_path(arch: str, large_head_dims: bool = False, varlen: bool = False,
               decode: bool = False, backward: bool = False, fp8: bool = False) -> Path:
    """Where the autotuner's launches for `arch` are: head dims 64-256, past 256, the
    variable-length forward's, the decode kernel's, the backward's (platforms/backward.py
    reads those) or the FP8 forward's."""
    suffix = "-large-head-dims" if large_head_dims else "-varlen" if varlen else \
        "-decode" if decode else "-backward" if backward else "-fp8" if fp8 else ""
    return TUNED_DIR / f"{arch}{suffix}.json"


def launch_record(head_dim: int, causal: bool, launch: TunedLaunch) -> dict:
    """One launch as the JSON file stores it."""
    tiles = launch.tiles
    tiled = {"tile_k": tiles.tile_k, "tile_v": tiles.tile_v} if tiles.tile_k else {}
    return {"head_dim": head_dim, "causal": causal, "step": launch.step,
            "tile_m": tiles.tile_m, "tile_n": tiles.tile_n, **tiled,
            "occupancy": launch.occupancy, "num_worker_warps": launch.num_worker_warps,
            "num_ctas": launch.num_ctas}


def decode_record(head_dim: int, launch: DecodeLaunch) -> dict:
    """One decode launch as the JSON file stores it."""
    return {"head_dim": head_dim, **dataclasses.asdict(launch)}


def _decode_launch(record: dict, where: str) -> tuple[int, DecodeLaunch]:
    missing = [key for key in REQUIRED_DECODE_KEYS if key not in record]
    if missing:
        raise ValueError(f"{where}: a decode launch lacks {missing}: {record}")
    if record["head_dim"] not in DECODE_GUESS:
        raise ValueError(f"{where}: head_dim must be one of {tuple(DECODE_GUESS)}: {record}")
    return record["head_dim"], DecodeLaunch(**{key: record[key] for key in DECODE_KEYS[1:]
                                               if key in record})


def _launch(record: dict, where: str) -> tuple[tuple[int, bool], TunedLaunch]:
    missing = [key for key in LAUNCH_KEYS if key not in record]
    if missing:
        raise ValueError(f"{where}: a launch lacks {missing}: {record}")
    if record["head_dim"] not in HEAD_DIMS + LARGE_HEAD_DIMS or \
            not isinstance(record["causal"], bool):
        raise ValueError(f"{where}: head_dim must be one of {HEAD_DIMS + LARGE_HEAD_DIMS} and "
                         f"causal a bool: {record}")
    tiles = TileShape(record["tile_m"], record["tile_n"],
                      *(record.get(key) for key in TILED_HEAD_DIM_KEYS))
    launch = TunedLaunch(step=record["step"], tiles=tiles, occupancy=record["occupancy"],
                         num_worker_warps=record["num_worker_warps"], num_ctas=record["num_ctas"])
    return (record["head_dim"], record["causal"]), launch


def load_launches(arch: str, path: Path, parse=_launch) -> tuple[dict, str]:
    """(launches, note) of one file, each launch record read by `parse`: (where, record)
    -> (key, launch)."""
    data = json.loads(path.read_text())
    where = f"platforms/tuned/{path.name}"
    if data.get("arch") != arch or set(CONTEXT_KEYS) - set(data.get("measured", {})):
        raise ValueError(f"{where}: must name arch {arch!r} and hold measured {CONTEXT_KEYS}")
    context = data["measured"]
    note = (f"{context['gpu']}, {context['date']}, cuda-tile {context['cuda_tile']}, tileiras "
            f"{context['tileiras']}, torch {context['torch']}, {context['shape']} "
            f"(assets/fmha_autotune.py)")
    return dict(parse(record, where) for record in data["launches"]), note


def load_tuned(arch: str) -> dict:
    """The PlatformEntry fields of `arch`'s files: "tuned" and "tuned_note" from the dense
    ones, "varlen_tuned" from the variable-length one, "decode" (over DECODE_GUESS) and
    "decode_note" from the decode one; {} where the autotuner has not run."""
    found = [load_launches(arch, path) for path in (tuned_path(arch), tuned_path(arch, True))
             if path.exists()]
    fields = {field: load_launches(arch, path)[0]
              for field, path in (("varlen_tuned", tuned_path(arch, varlen=True)),
                                  ("fp8_tuned", tuned_path(arch, fp8=True)))
              if path.exists()}
    decode = tuned_path(arch, decode=True)
    if decode.exists():
        launches, note = load_launches(arch, decode, _decode_launch)
        guessed = sorted(set(DECODE_GUESS) - set(launches))
        fields |= {"decode": DECODE_GUESS | launches,
                   "decode_note": f"D {sorted(launches)}: {note}" + (
                       f"; D {guessed}: DECODE_GUESS" if guessed else "")}
    if not found:
        return fields
    return fields | {
        "tuned": {key: launch for launches, _ in found for key, launch in launches.items()},
        "tuned_note": "; ".join(note for _, note in found)}


def launch_order(key) -> tuple:
    """Where a launch's key (a head dim, or a tuple of it and more) sorts: by head dim, an
    exact head-dim pair (D_qk, D_v) in its place after the head dims."""
    head_dims, *rest = key if isinstance(key, tuple) else (key,)
    return (isinstance(head_dims, tuple), head_dims, *rest)


def write_tuned(arch: str, context: dict, launches: dict, search: list[dict],
                path: Path, record=None) -> Path:
    """Writes the autotuner's result for `arch` to `path`: launches by (head dim, causal),
    or decode launches by head dim, or others with `record(key, launch)` -> its JSON."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [record(key, launch) if record else decode_record(key, launch)
               if isinstance(launch, DecodeLaunch) else launch_record(*key, launch)
               for key, launch in sorted(launches.items(), key=lambda item: launch_order(item[0]))]
    data = {"arch": arch, "measured": {key: context[key] for key in CONTEXT_KEYS},
            "launches": records, "search": search}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
