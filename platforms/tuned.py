"""The autotuner's results: JSON files per architecture in platforms/tuned/.

``python assets/fmha_autotune.py`` writes ``tuned/<arch>.json`` (head dims 64-256),
``tuned/<arch>-large-head-dims.json`` (steps 10-11, past 256), with --varlen
``tuned/<arch>-varlen.json`` (the variable-length forward), with --fp8
``tuned/<arch>-fp8.json`` (the FP8 forward, whose launches add ``fma_exp2``) and with --decode
``tuned/<arch>-decode.json`` (the decode kernel's launch and split rule per head dim), on a
GPU of that architecture:
where and with what it measured, the fastest launch per head dim and causal or not (the
step, its tiles and compiler hints), and the whole search table. The platform table reads
them, so the launcher runs the tuned steps at those tiles and hints and the drop-in runs
the fastest step. A search of some of a file's launches (``--head-dim 64``, or one backward
kernel) replaces those and keeps the others under "earlier", each with the run that
measured it.
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
# What a record of any of the files is the launch of; the rest of it is the launch.
IDENTITY_KEYS = ("head_dim", "value_head_dim", "causal", "kernel")
DECODE_KEYS = ("head_dim",) + tuple(field.name for field in dataclasses.fields(DecodeLaunch))
# What a decode record must hold; the others, which the autotuner does not search (a record
# written before they existed lacks them), take DECODE_GUESS's values at its head dim.
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
    fma = {"fma_exp2": launch.fma_exp2} if launch.fma_exp2 else {}
    return {"head_dim": head_dim, "causal": causal, "step": launch.step,
            "tile_m": tiles.tile_m, "tile_n": tiles.tile_n, **tiled,
            "occupancy": launch.occupancy, "num_worker_warps": launch.num_worker_warps,
            "num_ctas": launch.num_ctas, **fma}


def decode_record(head_dim: int, launch: DecodeLaunch) -> dict:
    """One decode launch as the JSON file stores it."""
    return {"head_dim": head_dim, **dataclasses.asdict(launch)}


def _decode_launch(record: dict, where: str) -> tuple[int, DecodeLaunch]:
    missing = [key for key in REQUIRED_DECODE_KEYS if key not in record]
    if missing:
        raise ValueError(f"{where}: a decode launch lacks {missing}: {record}")
    if record["head_dim"] not in DECODE_GUESS:
        raise ValueError(f"{where}: head_dim must be one of {tuple(DECODE_GUESS)}: {record}")
    try:
        return record["head_dim"], dataclasses.replace(  # JSON's lists back to tuples
            DECODE_GUESS[record["head_dim"]],
            **{key: tuple(record[key]) if isinstance(record[key], list) else record[key]
               for key in DECODE_KEYS[1:] if key in record})
    except ValueError as error:
        raise ValueError(f"{where}: {error}: {record}") from None


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
    if "fma_exp2" in record:
        raise ValueError(f"{where}: fma_exp2 is the FP8 forward's (its file's) only: {record}")
    return (record["head_dim"], record["causal"]), launch


def _fp8_launch(record: dict, where: str) -> tuple[tuple[int, bool], TunedLaunch]:
    """A launch of the FP8 forward's file: a launch and its share of exponentials on the
    FMA pipes (fma_exp2; none where the record lacks it)."""
    key, launch = _launch({k: v for k, v in record.items() if k != "fma_exp2"}, where)
    try:
        return key, dataclasses.replace(launch, fma_exp2=record.get("fma_exp2", 0))
    except ValueError as error:
        raise ValueError(f"{where}: {error}: {record}") from None


def record_key(record: dict) -> tuple:
    """What a launch record is the launch of: its head dims, causal or not and kernel."""
    return tuple(record.get(key) for key in IDENTITY_KEYS)


def _describe_context(context: dict) -> str:
    return (f"{context['gpu']}, {context['date']}, cuda-tile {context['cuda_tile']}, tileiras "
            f"{context['tileiras']}, torch {context['torch']}, {context['shape']} "
            f"(assets/fmha_autotune.py)")


def _describe_head_dims(records: list[dict]) -> str:
    dims = sorted({(r["head_dim"], r.get("value_head_dim") or r["head_dim"]) for r in records},
                  key=lambda d: (d[0] != d[1], d))
    return "D=" + ", ".join(str(q) if q == v else f"{q}/{v}" for q, v in dims)


def _runs(data: dict) -> list[dict]:
    """A file's runs, newest first: its own ("measured", "launches", "search") and the
    earlier ones it keeps."""
    own = {key: data.get(key, {} if key == "measured" else []) for key in
           ("measured", "launches", "search")}
    return [own] + data.get("earlier", [])


def load_launches(arch: str, path: Path, parse=_launch) -> tuple[dict, str]:
    """(launches, note) of one file, each launch record read by `parse`: (where, record)
    -> (key, launch); the launches of earlier runs the file keeps included, and named in
    the note with their run."""
    data = json.loads(path.read_text())
    where = f"platforms/tuned/{path.name}"
    runs = _runs(data)
    if data.get("arch") != arch or any(set(CONTEXT_KEYS) - set(run.get("measured", {}))
                                       for run in runs):
        raise ValueError(f"{where}: must name arch {arch!r} and hold measured {CONTEXT_KEYS} "
                         f"(also each earlier run's)")
    launches = dict(parse(record, where) for run in reversed(runs)  # the newest last: it wins
                    for record in run["launches"])
    if len(runs) == 1:
        return launches, _describe_context(data["measured"])
    return launches, "; ".join(
        f"{_describe_head_dims(run['launches'])}{' from an earlier run' if newer else ''}: "
        f"{_describe_context(run['measured'])}" for newer, run in enumerate(runs))


def runs_in(path: Path, arch: str) -> list[dict]:
    """The autotuner's runs whose launches `path` holds, newest first: its own
    ("measured", "launches", "search") and its earlier ones; none where there is no file or
    it is another architecture's. Read before a search, for write_tuned's `earlier`."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return _runs(data) if data.get("arch") == arch else []


def load_tuned(arch: str) -> dict:
    """The PlatformEntry fields of `arch`'s files: "tuned" and "tuned_note" from the dense
    ones, "varlen_tuned" from the variable-length one, "decode" (over DECODE_GUESS) and
    "decode_note" from the decode one; {} where the autotuner has not run."""
    found = [load_launches(arch, path) for path in (tuned_path(arch), tuned_path(arch, True))
             if path.exists()]
    files = (("varlen_tuned", tuned_path(arch, varlen=True), _launch),
             ("fp8_tuned", tuned_path(arch, fp8=True), _fp8_launch))
    fields = {field: load_launches(arch, path, parse)[0] for field, path, parse in files
              if path.exists()}
    decode = tuned_path(arch, decode=True)
    if decode.exists():
        launches, note = load_launches(arch, decode, _decode_launch)
        guessed = sorted(set(DECODE_GUESS) - set(launches))
        fields |= {"decode": DECODE_GUESS | launches,
                   "decode_note": note + (f"; D {guessed}: DECODE_GUESS" if guessed else "")}
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
                path: Path, record=None, earlier: list[dict] = ()) -> Path:
    """Writes the autotuner's result for `arch` to `path`: launches by (head dim, causal),
    or decode launches by head dim, or others with `record(key, launch)` -> its JSON; with
    the launches of `earlier` runs (runs_in, newest first) that none newer has, under
    "earlier"."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [record(key, launch) if record else decode_record(key, launch)
               if isinstance(launch, DecodeLaunch) else launch_record(*key, launch)
               for key, launch in sorted(launches.items(), key=lambda item: launch_order(item[0]))]
    covered, kept = {record_key(r) for r in records}, []
    for run in earlier:
        left = [r for r in run["launches"] if record_key(r) not in covered]
        covered |= {record_key(r) for r in left}
        if left:
            kept.append(run | {"launches": left})
    data = {"arch": arch, "measured": {key: context[key] for key in CONTEXT_KEYS},
            "launches": records, "search": search} | ({"earlier": kept} if kept else {})
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
