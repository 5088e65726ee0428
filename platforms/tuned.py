"""The autotuner's results: JSON files per architecture in platforms/tuned/.

``python assets/fmha_autotune.py`` writes ``tuned/<arch>.json`` (head dims 64-256),
``tuned/<arch>-large-head-dims.json`` (steps 10-11, past 256) and, with --varlen,
``tuned/<arch>-varlen.json`` (the variable-length forward) on a GPU of that architecture:
where and with what it measured, the fastest launch per head dim and causal or not (the
step, its tiles and compiler hints), and the whole search table. The platform table reads
them, so the launcher runs the tuned steps at those tiles and hints and the drop-in runs
the fastest step.
"""

import json
from pathlib import Path

from .entry import HEAD_DIMS, LARGE_HEAD_DIMS, TileShape, TunedLaunch

TUNED_DIR = Path(__file__).with_name("tuned")
CONTEXT_KEYS = ("gpu", "date", "cuda_tile", "tileiras", "torch", "shape")
LAUNCH_KEYS = ("head_dim", "causal", "step", "tile_m", "tile_n", "occupancy",
               "num_worker_warps", "num_ctas")
TILED_HEAD_DIM_KEYS = ("tile_k", "tile_v")  # steps 10-11's launches also have these


def tuned_path(arch: str, large_head_dims: bool = False, varlen: bool = False) -> Path:
    """Where the autotuner's launches for `arch` are: head dims 64-256, past 256, or the
    variable-length forward's."""
    suffix = "-large-head-dims" if large_head_dims else "-varlen" if varlen else ""
    return TUNED_DIR / f"{arch}{suffix}.json"


def launch_record(head_dim: int, causal: bool, launch: TunedLaunch) -> dict:
    """One launch as the JSON file stores it."""
    tiles = launch.tiles
    tiled = {"tile_k": tiles.tile_k, "tile_v": tiles.tile_v} if tiles.tile_k else {}
    return {"head_dim": head_dim, "causal": causal, "step": launch.step,
            "tile_m": tiles.tile_m, "tile_n": tiles.tile_n, **tiled,
            "occupancy": launch.occupancy, "num_worker_warps": launch.num_worker_warps,
            "num_ctas": launch.num_ctas}


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


def _load(arch: str, path: Path) -> tuple[dict, str]:
    """(launches, note) of one file."""
    data = json.loads(path.read_text())
    where = f"platforms/tuned/{path.name}"
    if data.get("arch") != arch or set(CONTEXT_KEYS) - set(data.get("measured", {})):
        raise ValueError(f"{where}: must name arch {arch!r} and hold measured {CONTEXT_KEYS}")
    context = data["measured"]
    note = (f"{context['gpu']}, {context['date']}, cuda-tile {context['cuda_tile']}, tileiras "
            f"{context['tileiras']}, torch {context['torch']}, {context['shape']} "
            f"(assets/fmha_autotune.py)")
    return dict(_launch(record, where) for record in data["launches"]), note


def load_tuned(arch: str) -> dict:
    """The PlatformEntry fields of `arch`'s files: "tuned" and "tuned_note" from the dense
    ones, "varlen_tuned" from the variable-length one; {} where the autotuner has not run."""
    found = [_load(arch, path) for path in (tuned_path(arch), tuned_path(arch, True))
             if path.exists()]
    varlen = tuned_path(arch, varlen=True)
    fields = {"varlen_tuned": _load(arch, varlen)[0]} if varlen.exists() else {}
    if not found:
        return fields
    return fields | {
        "tuned": {key: launch for launches, _ in found for key, launch in launches.items()},
        "tuned_note": "; ".join(note for _, note in found)}


def write_tuned(arch: str, context: dict, launches: dict[tuple[int, bool], TunedLaunch],
                search: list[dict], path: Path) -> Path:
    """Writes the autotuner's result for `arch` to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"arch": arch, "measured": {key: context[key] for key in CONTEXT_KEYS},
            "launches": [launch_record(d, c, launch) for (d, c), launch in sorted(launches.items())],
            "search": search}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
