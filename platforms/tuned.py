"""The autotuner's results: one JSON file per architecture in platforms/tuned/.

``python assets/fmha_autotune.py`` writes ``tuned/<arch>.json`` on a GPU of that
architecture: where and with what it measured, the fastest launch per head dim and causal
or not (the step, its tiles and compiler hints), and the whole search table. The platform
table reads it, so the launcher runs the tuned steps at those tiles and hints and the
drop-in runs the fastest step.
"""

import json
from pathlib import Path

from .entry import HEAD_DIMS, TileShape, TunedLaunch

TUNED_DIR = Path(__file__).with_name("tuned")
CONTEXT_KEYS = ("gpu", "date", "cuda_tile", "tileiras", "torch", "shape")
LAUNCH_KEYS = ("head_dim", "causal", "step", "tile_m", "tile_n", "occupancy",
               "num_worker_warps", "num_ctas")


def tuned_path(arch: str) -> Path:
    return TUNED_DIR / f"{arch}.json"


def launch_record(head_dim: int, causal: bool, launch: TunedLaunch) -> dict:
    """One launch as the JSON file stores it."""
    return {"head_dim": head_dim, "causal": causal, "step": launch.step,
            "tile_m": launch.tiles.tile_m, "tile_n": launch.tiles.tile_n,
            "occupancy": launch.occupancy, "num_worker_warps": launch.num_worker_warps,
            "num_ctas": launch.num_ctas}


def _launch(record: dict, where: str) -> tuple[tuple[int, bool], TunedLaunch]:
    missing = [key for key in LAUNCH_KEYS if key not in record]
    if missing:
        raise ValueError(f"{where}: a launch lacks {missing}: {record}")
    if record["head_dim"] not in HEAD_DIMS or not isinstance(record["causal"], bool):
        raise ValueError(f"{where}: head_dim must be one of {HEAD_DIMS} and causal a bool: {record}")
    launch = TunedLaunch(step=record["step"], tiles=TileShape(record["tile_m"], record["tile_n"]),
                         occupancy=record["occupancy"],
                         num_worker_warps=record["num_worker_warps"], num_ctas=record["num_ctas"])
    return (record["head_dim"], record["causal"]), launch


def load_tuned(arch: str) -> dict:
    """{"tuned": ..., "tuned_note": ...} for PlatformEntry, or {} where the autotuner has
    not run on `arch`."""
    path = tuned_path(arch)
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    where = f"platforms/tuned/{path.name}"
    if data.get("arch") != arch or set(CONTEXT_KEYS) - set(data.get("measured", {})):
        raise ValueError(f"{where}: must name arch {arch!r} and hold measured {CONTEXT_KEYS}")
    context = data["measured"]
    note = (f"{context['gpu']}, {context['date']}, cuda-tile {context['cuda_tile']}, tileiras "
            f"{context['tileiras']}, torch {context['torch']}, {context['shape']} "
            f"(assets/fmha_autotune.py)")
    return {"tuned": dict(_launch(record, where) for record in data["launches"]),
            "tuned_note": note}


def write_tuned(arch: str, context: dict, launches: dict[tuple[int, bool], TunedLaunch],
                search: list[dict], path: Path | None = None) -> Path:
    """Writes the autotuner's result for `arch` (to platforms/tuned/ unless `path`)."""
    path = path or tuned_path(arch)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"arch": arch, "measured": {key: context[key] for key in CONTEXT_KEYS},
            "launches": [launch_record(d, c, launch) for (d, c), launch in sorted(launches.items())],
            "search": search}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
