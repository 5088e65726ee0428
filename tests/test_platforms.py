"""Invariants of the platform tables and of the ByTarget value built from them."""

import dataclasses
import json
import re

import pytest
import torch

from cutile_fmha.kernels import step6_approx_div
from cutile_fmha.platforms import (DEFAULT, HEAD_DIMS, LARGE_HEAD_DIMS, PLATFORMS, PlatformEntry,
                                   TileShape, TunedLaunch, entry_for, occupancy_by_target,
                                   worker_warps_by_target)
from cutile_fmha.platforms import tuned
from cutile_fmha.platforms.backward import (ATOMIC_DQ_FEATURES, BACKWARD_ENTRIES,
                                            DEFAULT_BACKWARD, backward_entry_for)
from cutile_fmha.platforms.entry import DECODE_GUESS, SOURCES, DecodeLaunch, launch_head_dim
from cutile_fmha.platforms.environment import find_compiler
from cutile_fmha.steps import STEPS
from cutile_fmha.steps.backward import adds_dq_atomically, launches_for, query_chunk_rows
from cutile_fmha.steps.definitions import GUIDE_FINAL_STEP, fastest_step, step_of
from cutile_fmha.steps.definitions import QUERY_TILE_STEP
from cutile_fmha.steps.launcher import split_head_dim
from cutile_fmha.steps.variants import NO_VARIANTS, Variants

ENTRIES = list(PLATFORMS.values()) + [DEFAULT]


def test_table_has_the_architectures_the_playbook_targets():
    assert {"sm_121", "sm_103", "sm_100", "sm_120", "sm_90", "sm_89", "sm_80"} <= set(PLATFORMS)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: e.arch)
def test_entry_is_complete_and_sane(entry):
    assert entry.arch == "default" or re.fullmatch(r"sm_\d{2,3}", entry.arch)
    assert set(entry.tiles) == set(HEAD_DIMS)
    for tiles in entry.tiles.values():
        for size in (tiles.tile_m, tiles.tile_n):
            assert size >= 16 and size & (size - 1) == 0, "tile sizes are powers of two"
    assert 1 <= entry.occupancy <= 32
    assert entry.source in SOURCES
    assert entry.note and entry.gpus
    for head_dim in LARGE_HEAD_DIMS:  # the rule past D=256 gives a launch for every one
        tiles = entry.large_head_dim_launch(head_dim).tiles
        assert head_dim % tiles.tile_k == 0 and head_dim % tiles.tile_v == 0


@pytest.mark.parametrize("arch", sorted(PLATFORMS))
def test_keys_name_their_entries(arch):
    assert PLATFORMS[arch].arch == arch


def test_measured_entries_name_device_and_date():
    for entry in ENTRIES:
        if entry.source == "measured":
            assert re.search(r"\d{4}-\d{2}-\d{2}", entry.note), entry.arch
            assert re.search(r"H100|H200|B200|B300|GB10|A100|L40", entry.note), entry.arch


def test_unmeasured_entries_say_so():
    for entry in ENTRIES:
        if entry.source == "unmeasured":
            assert re.search(r"not timed|unmeasured", entry.note), entry.arch


def test_guide_rows_are_the_guides_numbers():
    spark, b300 = PLATFORMS["sm_121"], PLATFORMS["sm_103"]
    assert (spark.tiles[128].tile_m, spark.tiles[128].tile_n, spark.occupancy) == (64, 64, 2)
    assert (b300.tiles[128].tile_m, b300.tiles[128].tile_n, b300.occupancy) == (256, 128, 1)
    assert spark.source == b300.source == "guide"


def test_occupancy_by_target_is_the_occupancy_column():
    expected = f"ByTarget({', '.join(f'{a}={e.occupancy}' for a, e in PLATFORMS.items())}, " \
               f"default={DEFAULT.occupancy})"
    assert repr(occupancy_by_target()) == expected


def test_entry_lookup():
    assert entry_for("sm_90") is PLATFORMS["sm_90"]
    assert entry_for("sm_86") is DEFAULT  # no entry of its own
    assert entry_for("default") is DEFAULT
    with pytest.raises(ValueError, match="platform must be an architecture name"):
        entry_for("hopper")


def test_every_table_architecture_is_one_the_compiler_knows():
    compiler = find_compiler()
    if not compiler.gpu_names:
        pytest.skip("tileiras is not installed")
    assert set(PLATFORMS) <= set(compiler.gpu_names)


def test_worker_warps_by_target_lists_the_architectures_that_set_it():
    expected = ", ".join(f"{a}={e.worker_warps}" for a, e in PLATFORMS.items()
                         if e.worker_warps is not None)
    assert repr(worker_warps_by_target()) == f"ByTarget({expected})"
    assert PLATFORMS["sm_90"].worker_warps == 8


@pytest.mark.parametrize("path", sorted(tuned.TUNED_DIR.glob("*.json")), ids=lambda p: p.name)
def test_tuned_files_load_and_name_tuned_steps(path):
    arch = path.stem.removesuffix("-large-head-dims").removesuffix("-varlen") \
        .removesuffix("-decode").removesuffix("-backward").removesuffix("-fp8")
    assert arch in PLATFORMS, f"{path.name} is for an architecture without an entry"
    loaded = tuned.load_tuned(arch)
    if path.stem.endswith("-backward"):
        assert backward_entry_for(arch).provenance.startswith("D=")
        return
    if path.stem.endswith("-decode"):
        assert loaded["decode"] == PLATFORMS[arch].decode and loaded["decode_note"]
        assert all(launch.tile_n >= 16 and launch.tile_n & (launch.tile_n - 1) == 0
                   for launch in loaded["decode"].values())
        return
    # The variable-length and FP8 forwards run step 9's query tile.
    field = {"-varlen": "varlen_tuned", "-fp8": "fp8_tuned"}.get(path.stem[len(arch):], "tuned")
    assert loaded[field] == getattr(PLATFORMS[arch], field)
    if field == "tuned":
        assert loaded["tuned_note"]
    else:
        assert {launch.step for launch in loaded[field].values()} == {QUERY_TILE_STEP}
    for (head_dim, causal), launch in loaded[field].items():
        assert head_dim in STEPS[launch.step].head_dims and isinstance(causal, bool)
        assert STEPS[launch.step].launch == "tuned"
        for size in (launch.tiles.tile_m, launch.tiles.tile_n):
            assert size >= 16 and size & (size - 1) == 0
        if head_dim in LARGE_HEAD_DIMS:  # the head dim tiled: chunks and slices divide it
            assert head_dim % launch.tiles.tile_k == 0 and head_dim % launch.tiles.tile_v == 0
    assert json.loads(path.read_text())["search"], "the search's table is kept with the result"


CONTEXT = {"gpu": "NVIDIA H100 80GB HBM3", "date": "2026-11-22", "cuda_tile": "1.7.0",
           "tileiras": "13.5", "torch": "2.11.0+cu130", "shape": "B=4 N=8192 float16"}


def test_tuned_entry_round_trips(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    launches = {(128, True): TunedLaunch(9, TileShape(128, 128), 1, 8),
                (64, False): TunedLaunch(7, TileShape(128, 64), 2, None, 2)}
    large = {(1024, True): TunedLaunch(10, TileShape(64, 64, tile_k=64, tile_v=512), 1, 8)}
    tuned.write_tuned("sm_90", CONTEXT, launches, [{"tflops": 1.0}], tuned.tuned_path("sm_90"))
    tuned.write_tuned("sm_90", CONTEXT | {"shape": "B=1 H=48"}, large, [],
                      tuned.tuned_path("sm_90", large_head_dims=True))
    loaded = tuned.load_tuned("sm_90")
    assert loaded["tuned"] == launches | large
    assert loaded["tuned_note"].startswith("NVIDIA H100 80GB HBM3, 2026-11-22, cuda-tile 1.7.0")
    assert "B=1 H=48" in loaded["tuned_note"]
    assert launches[(64, False)].hints() == {"occupancy": 2, "num_worker_warps": None,
                                             "num_ctas": 2}
    assert tuned.load_tuned("sm_80") == {}  # never tuned there
    varlen = {(128, True): TunedLaunch(9, TileShape(64, 128), 2, None)}
    tuned.write_tuned("sm_90", CONTEXT, varlen, [], tuned.tuned_path("sm_90", varlen=True))
    assert tuned.load_tuned("sm_90")["varlen_tuned"] == varlen
    assert tuned.load_tuned("sm_90")["tuned"] == launches | large
    decode = {128: DecodeLaunch(64, 1, None, 2, 512)}
    tuned.write_tuned("sm_90", CONTEXT | {"shape": "one token"}, decode, [],
                      tuned.tuned_path("sm_90", decode=True))
    loaded = tuned.load_tuned("sm_90")
    assert loaded["decode"] == DECODE_GUESS | decode and "one token" in loaded["decode_note"]
    # a record written before unsplit_keys, one_wave_columns, rows_columns, rows_block_size,
    # rows_padded_columns, rows_wide_blocks and one_wave_refused_ctas_per_sm existed takes
    # DECODE_GUESS's values at its head dim
    path = tuned.tuned_path("sm_90", decode=True)
    data = json.loads(path.read_text())
    for key in ("unsplit_keys", "one_wave_columns", "rows_columns", "rows_block_size",
                "rows_padded_columns", "rows_wide_blocks", "one_wave_refused_ctas_per_sm"):
        del data["launches"][0][key]
    path.write_text(json.dumps(data))
    assert tuned.load_tuned("sm_90")["decode"][128] == dataclasses.replace(
        decode[128], one_wave_columns=DECODE_GUESS[128].one_wave_columns,
        rows_columns=DECODE_GUESS[128].rows_columns,
        rows_block_size=DECODE_GUESS[128].rows_block_size,
        rows_padded_columns=DECODE_GUESS[128].rows_padded_columns,
        rows_wide_blocks=DECODE_GUESS[128].rows_wide_blocks,
        one_wave_refused_ctas_per_sm=DECODE_GUESS[128].one_wave_refused_ctas_per_sm)
    for key, wrong in (("one_wave_columns", 48), ("one_wave_tiles", [256, 96]),
                       ("one_wave_blocks", 0), ("rows_columns", 32), ("rows_block_size", 8),
                       ("rows_padded_columns", 64), ("rows_wide_blocks", 0),
                       ("one_wave_refused_ctas_per_sm", 0)):
        path.write_text(json.dumps(data | {"launches": [data["launches"][0] | {key: wrong}]}))
        with pytest.raises(ValueError, match=rf"sm_90-decode.json: {key} must be"):
            tuned.load_tuned("sm_90")
    del data["launches"][0]["tile_n"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"a decode launch lacks \['tile_n'\]"):
        tuned.load_tuned("sm_90")


def test_tuned_backward_launches_replace_the_tables(tmp_path, monkeypatch):
    from cutile_fmha.platforms import backward

    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    backward_entry_for.cache_clear()
    launch = backward.BackwardLaunch(TileShape(128, 128), 4)
    tuned.write_tuned("sm_90", CONTEXT | {"shape": "backward"}, {(128, "dq"): launch}, [],
                      tuned.tuned_path("sm_90", backward=True), record=backward.backward_record)
    entry = backward_entry_for("sm_90")
    assert entry.launches[128]["dq"] == launch
    assert entry.launches[128]["dkdv"] == backward.SM_90.launches[128]["dkdv"]
    assert entry.launches[64] == backward.SM_90.launches[64]
    assert entry.provenance.startswith("D=128 dq: NVIDIA H100 80GB HBM3")
    backward_entry_for.cache_clear()


def test_tuned_dkdv_dq_retiles_the_table_s_launch_and_keeps_its_rule(tmp_path, monkeypatch):
    from cutile_fmha.platforms import backward

    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    backward_entry_for.cache_clear()
    tuned.write_tuned("sm_90", CONTEXT | {"shape": "backward"},
                      {(128, "dkdv_dq"): backward.BackwardLaunch(TileShape(128, 64), 4),
                       (64, "dkdv_dq"): backward.BackwardLaunch(TileShape(64, 128), 8,
                                                                dq_late=True)}, [],
                      tuned.tuned_path("sm_90", backward=True), record=backward.backward_record)
    table = backward.SM_90.launches
    assert table[128]["dkdv_dq"].dq_late and not table[64]["dkdv_dq"].dq_late
    tuned_launches = backward_entry_for("sm_90").launches  # dq_late is the search's too
    assert tuned_launches[128]["dkdv_dq"] == dataclasses.replace(
        table[128]["dkdv_dq"], tiles=TileShape(128, 64), num_worker_warps=4, dq_late=False)
    assert tuned_launches[64]["dkdv_dq"] == dataclasses.replace(
        table[64]["dkdv_dq"], tiles=TileShape(64, 128), dq_late=True)
    backward_entry_for.cache_clear()
    without = dataclasses.replace(backward.SM_90, launches={
        d: {k: launch for k, launch in kernels.items() if k != "dkdv_dq"}
        for d, kernels in backward.SM_90.launches.items()})
    with pytest.raises(ValueError, match="D=128 has no 'dkdv_dq' launch"):
        backward.with_launches(without, {(128, "dkdv_dq"): table}, "a candidate")


def test_tuned_exact_head_dim_pairs_take_their_own_launches(tmp_path, monkeypatch):
    from cutile_fmha.platforms import backward

    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    backward_entry_for.cache_clear()
    path = tuned.tuned_path("sm_90", backward=True)
    launches = {((192, 128), "dkdv_dq"): backward.BackwardLaunch(TileShape(64, 128), 4),
                ((160, 128), "dkdv_dq"): backward.BackwardLaunch(TileShape(32, 128), 8),
                ((192, 128), "dq"): backward.BackwardLaunch(TileShape(128, 32), 8),
                (64, "dq"): backward.BackwardLaunch(TileShape(128, 128), 8)}
    tuned.write_tuned("sm_90", CONTEXT | {"shape": "backward"}, launches, [], path,
                      record=backward.backward_record)
    records = json.loads(path.read_text())["launches"]
    # head dims first, then the pairs
    assert [(r["head_dim"], r.get("value_head_dim"), r["kernel"]) for r in records] == [
        (64, None, "dq"), (160, 128, "dkdv_dq"), (192, 128, "dkdv_dq"), (192, 128, "dq")]
    entry = backward_entry_for("sm_90")
    table = backward.SM_90.exact_launches[(192, 128)]["dkdv_dq"]
    # a pair's own launch is retiled, keeping its rule and split head dims
    assert entry.exact_launches[(192, 128)]["dkdv_dq"] == dataclasses.replace(
        table, tiles=TileShape(64, 128), num_worker_warps=4)
    assert entry.exact_launches[(192, 128)]["dq"] == launches[((192, 128), "dq")]
    # a pair without one takes its launch head dim's, retiled
    assert entry.exact_launches[(160, 128)]["dkdv_dq"] == dataclasses.replace(
        backward.SM_90.launches[256]["dkdv_dq"], tiles=TileShape(32, 128))
    assert launches_for(entry, 160, 128)["dkdv"] == backward.SM_90.launches[256]["dkdv"]
    assert entry.launches[64]["dq"] == launches[(64, "dq")]
    assert entry.launches[256] == backward.SM_90.launches[256]
    assert "D=192/128 dkdv_dq" in entry.provenance
    backward_entry_for.cache_clear()
    for head_dim, value_head_dim in ((128, 128), (192, 320), (0, 128)):
        path.write_text(json.dumps({"arch": "sm_90", "measured": CONTEXT, "search": [],
                                    "launches": [{"head_dim": head_dim, "value_head_dim":
                                                  value_head_dim, "kernel": "dkdv_dq",
                                                  "tile_m": 64, "tile_n": 64,
                                                  "num_worker_warps": 8}]}))
        with pytest.raises(ValueError, match="with value_head_dim, two head dims up to 256"):
            backward_entry_for("sm_90")
        backward_entry_for.cache_clear()


def test_a_partial_search_keeps_the_launches_it_did_not_measure(tmp_path, monkeypatch):
    from cutile_fmha.platforms import backward

    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    path = tuned.tuned_path("sm_90")
    first = {(d, c): TunedLaunch(9, TileShape(128, 128), 1, 8) for d in (64, 128, 256)
             for c in (True, False)}
    tuned.write_tuned("sm_90", CONTEXT, first, [{"run": 1}], path,
                      earlier=tuned.runs_in(path, "sm_90"))
    assert "earlier" not in json.loads(path.read_text())
    # a search of D=64 only: D=128 and 256 stay, with the run that measured them
    second = {(64, c): TunedLaunch(8, TileShape(128, 64), 2, 8) for c in (True, False)}
    later = CONTEXT | {"date": "2026-11-26", "tileiras": "13.4"}
    tuned.write_tuned("sm_90", later, second, [{"run": 2}], path,
                      earlier=tuned.runs_in(path, "sm_90"))
    loaded = tuned.load_tuned("sm_90")
    assert loaded["tuned"] == first | second
    assert loaded["tuned_note"].startswith("D=64: NVIDIA H100 80GB HBM3, 2026-11-26, cuda-tile "
                                           "1.7.0, tileiras 13.4")
    assert "; D=128, 256 from an earlier run: NVIDIA H100 80GB HBM3, 2026-11-22" in \
        loaded["tuned_note"]
    data = json.loads(path.read_text())
    assert data["search"] == [{"run": 2}] and [run["search"] for run in data["earlier"]] == [
        [{"run": 1}]]
    # then D=128: the first run keeps D=256 only, the second its D=64, newest first
    tuned.write_tuned("sm_90", later | {"date": "2026-11-27"},
                      {(128, c): first[(128, c)] for c in (True, False)}, [], path,
                      earlier=tuned.runs_in(path, "sm_90"))
    data = json.loads(path.read_text())
    assert [({r["head_dim"] for r in run["launches"]}, run["measured"]["date"])
            for run in data["earlier"]] == [({64}, "2026-11-26"), ({256}, "2026-11-22")]
    assert tuned.load_tuned("sm_90")["tuned"] == first | second
    # another architecture's file is not merged; a search of the whole file leaves no earlier
    assert tuned.runs_in(path, "sm_100") == []
    tuned.write_tuned("sm_90", CONTEXT, first, [], path, earlier=tuned.runs_in(path, "sm_90"))
    assert "earlier" not in json.loads(path.read_text())
    # the backward's: a search of "dkdv_dq" keeps D=128's "dkdv" and "dq"
    backward_entry_for.cache_clear()
    path = tuned.tuned_path("sm_90", backward=True)
    two = {(128, kernel): backward.BackwardLaunch(TileShape(64, 64), 8) for kernel in ("dkdv", "dq")}
    tuned.write_tuned("sm_90", CONTEXT, two, [], path, record=backward.backward_record)
    one = {(128, "dkdv_dq"): backward.BackwardLaunch(TileShape(64, 64), 4)}
    tuned.write_tuned("sm_90", later, one, [], path, record=backward.backward_record,
                      earlier=tuned.runs_in(path, "sm_90"))
    entry = backward_entry_for("sm_90")
    assert entry.launches[128]["dkdv"] == two[(128, "dkdv")] and entry.launches[128]["dq"] == \
        two[(128, "dq")] and entry.launches[128]["dkdv_dq"].tiles == TileShape(64, 64)
    assert "D=128 from an earlier run" in entry.provenance
    backward_entry_for.cache_clear()
    # an earlier run without its context names the file
    data = json.loads(path.read_text())
    del data["earlier"][0]["measured"]["gpu"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"sm_90-backward.json: must name arch 'sm_90' and hold "
                                         r"measured .* \(also each earlier run's\)"):
        backward_entry_for("sm_90")
    backward_entry_for.cache_clear()


def test_fp8_launches_carry_their_share_of_exponentials_on_the_fma_pipes(tmp_path, monkeypatch):
    """The FP8 file's launches keep fma_exp2 (a record without it has none); it must be a
    power of two the tile's columns allow, and no other file's launch takes it."""
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    launches = {(128, False): TunedLaunch(9, TileShape(128, 256), 1, 8, fma_exp2=8),
                (128, True): TunedLaunch(9, TileShape(128, 128), 1, 8)}
    path = tuned.tuned_path("sm_90", fp8=True)
    tuned.write_tuned("sm_90", CONTEXT, launches, [], path)
    assert tuned.load_tuned("sm_90")["fp8_tuned"] == launches
    data = json.loads(path.read_text())
    assert [record.get("fma_exp2") for record in data["launches"]] == [8, None]
    for share in (3, 64, 1):  # not a power of two; more than 256 / 8 columns allow; one
        data["launches"][0]["fma_exp2"] = share
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=r"sm_90-fp8.json: fma_exp2 must be 0 or a power "
                                             r"of two from 2 up to tile_n / 8 \(32\), got"):
            tuned.load_tuned("sm_90")
    with pytest.raises(ValueError, match=r"fma_exp2 must be .* up to tile_n / 8 \(8\), got 16"):
        TunedLaunch(9, TileShape(128, 64), 1, 8, fma_exp2=16)
    path.unlink()
    tuned.write_tuned("sm_90", CONTEXT, launches, [], tuned.tuned_path("sm_90", varlen=True))
    with pytest.raises(ValueError, match=r"sm_90-varlen.json: fma_exp2 is the FP8 forward's"):
        tuned.load_tuned("sm_90")


def test_malformed_tuned_file_names_itself(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "TUNED_DIR", tmp_path)
    (tmp_path / "sm_90.json").write_text(json.dumps(
        {"arch": "sm_90", "measured": CONTEXT, "launches": [{"head_dim": 96}], "search": []}))
    with pytest.raises(ValueError, match=r"platforms/tuned/sm_90.json: a launch lacks"):
        tuned.load_tuned("sm_90")


TUNED_HINTS = {"occupancy": 1, "num_worker_warps": 8, "num_ctas": None}
ENTRY = PlatformEntry("sm_99", "test", {128: TileShape(64, 128)}, 2, "unmeasured", "not timed",
                      worker_warps=8, tuned={(128, True): TunedLaunch(9, TileShape(128, 128), 1, 8)})


@pytest.mark.parametrize("step,native,causal,expected", [
    (1, False, True, (TileShape(64, 128), None)),  # the guide's steps take no hints
    (6, True, True, (TileShape(64, 128), None)),  # natively, the kernel's ByTarget holds them
    (6, False, True, (TileShape(64, 128), {"occupancy": 2})),  # another arch's entry brings its own
    (7, False, False, (TileShape(64, 128), {"occupancy": 2, "num_worker_warps": 8})),
    (7, True, True, (TileShape(128, 128), TUNED_HINTS)),  # tuned, whichever entry
    (9, False, True, (TileShape(128, 128), TUNED_HINTS)),
])
def test_where_each_step_takes_its_launch_from(step, native, causal, expected):
    assert STEPS[step].launch_config(ENTRY, native=native, head_dim=128, causal=causal) == expected


def test_fastest_step_is_the_tuned_one_else_the_guides_last():
    assert fastest_step(ENTRY, 128, True) == 9
    assert fastest_step(ENTRY, 128, False) == GUIDE_FINAL_STEP == step_of(step6_approx_div).number


def test_backward_launches_cover_every_head_dim_and_say_where_they_come_from():
    for entry in [*BACKWARD_ENTRIES.values(), DEFAULT_BACKWARD]:
        assert set(entry.launches) == set(HEAD_DIMS)
        assert all({"dkdv", "dq"} <= set(kernels) <= {"dkdv", "dq", "dkdv_dq"}
                   for kernels in entry.launches.values())
        assert all(launch.only_with is None or (name == "dkdv_dq" and launch.only_with
                                                and launch.only_with <= ATOMIC_DQ_FEATURES)
                   for kernels in entry.launches.values() for name, launch in kernels.items())
        assert all(launch.up_to_query_group == 0 or launch.only_with
                   for kernels in entry.launches.values() for launch in kernels.values())
        assert all(split_head_dim(d)[1] > 0 for kernels in entry.launches.values()
                   for launch in kernels.values() for d in launch.split_head_dims)
        assert all(launch_head_dim(*head_dims) in entry.launches
                   and set(kernels) <= {"dkdv", "dq", "dkdv_dq"}
                   for head_dims, kernels in entry.exact_launches.items())
        assert entry.provenance
    assert "H100" in backward_entry_for("sm_90").provenance
    assert backward_entry_for("sm_103") is DEFAULT_BACKWARD
    assert DEFAULT_BACKWARD.provenance.startswith("unmeasured")


@pytest.mark.parametrize("q_head_dim,v_head_dim,group,variants,causal,varlen,deterministic,adds", [
    (64, 64, 8, NO_VARIANTS, True, False, False, True),     # "dkdv_dq" for every call
    (64, 64, 1, NO_VARIANTS, True, False, True, False),     # not under deterministic algorithms
    (128, 128, 8, NO_VARIANTS, True, False, False, False),  # only with what only_with names ...
    (128, 128, 4, NO_VARIANTS, False, False, False, True),  # (no causal mask, ...
    (128, 128, 8, NO_VARIANTS, False, False, True, False),
    (128, 128, 8, NO_VARIANTS, True, True, False, True),    # ... a variable-length batch) ...
    (128, 128, 4, NO_VARIANTS, True, False, False, True),   # ... or up to 4 query heads a K/V head
    (128, 128, 2, NO_VARIANTS, True, False, False, True),
    (128, 128, 1, NO_VARIANTS, True, False, False, True),
    (128, 128, 1, NO_VARIANTS, True, False, True, False),
    (128, 128, 8, Variants(softcap=30.0), True, False, False, True),
    (128, 128, 4, Variants(window=(512, 0)), True, False, False, True),
    (128, 128, 8, Variants(sinks=True), True, False, False, False),
    (96, 96, 4, NO_VARIANTS, True, False, False, True),     # split columns, 64 + 32
    (80, 80, 4, NO_VARIANTS, True, False, False, True),     # 64 + 16
    (112, 112, 8, NO_VARIANTS, True, False, False, False),  # padded to 128, not split
    (192, 128, 4, NO_VARIANTS, True, False, False, True),   # D=256's launch, for every call
    (160, 160, 4, NO_VARIANTS, True, False, False, True),
])
def test_dq_is_added_atomically_where_the_launch_says(monkeypatch, q_head_dim, v_head_dim,
                                                      group, variants, causal, varlen,
                                                      deterministic, adds):
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    entry = backward_entry_for("sm_90")
    assert entry.launches[128]["dkdv_dq"].only_with == ATOMIC_DQ_FEATURES
    assert entry.launches[128]["dkdv_dq"].up_to_query_group == 4
    assert adds_dq_atomically(entry, q_head_dim, v_head_dim, group, variants, causal=causal,
                              varlen=varlen) == adds


@pytest.mark.parametrize("head_dim,q_len,group,variants,causal,varlen,rows", [
    (128, 65536, 1, NO_VARIANTS, False, False, 16384),   # 4x the platform's rows per K/V head
    (112, 65537, 1, Variants(softcap=30.0), False, False, 16384),  # 112: padded to 128
    (128, 16384, 4, NO_VARIANTS, False, False, 4096),    # rows per K/V head: q_len x its group
    (128, 65535, 1, NO_VARIANTS, False, False, None),    # fewer: one launch
    (128, 8192, 4, NO_VARIANTS, False, False, None),
    (128, 65536, 1, NO_VARIANTS, True, False, None),     # the causal mask,
    (128, 65536, 1, Variants(window=(512, 512)), False, False, None),  # a window,
    (128, 65536, 1, NO_VARIANTS, False, True, None),     # a packed batch,
    (96, 65536, 1, NO_VARIANTS, False, False, None),     # split columns (64 + 32, 64 + 16)
    (80, 131072, 1, NO_VARIANTS, False, False, None),    # at D=128's launch: one launch
])
def test_long_non_causal_backward_runs_its_queries_in_chunks(head_dim, q_len, group, variants,
                                                             causal, varlen, rows):
    entry = backward_entry_for("sm_90")
    assert [d for d, kernels in entry.launches.items()
            if kernels["dkdv_dq"].chunk_query_rows] == [128]  # D=64 and 256 lost in chunks
    launch = launches_for(entry, head_dim, head_dim)["dkdv_dq"]
    assert launch is entry.launches[128]["dkdv_dq"]
    assert query_chunk_rows(launch, head_dim, q_len, group, causal, variants, varlen) == rows
    assert query_chunk_rows(entry.launches[64]["dkdv_dq"], 64, q_len, group, causal, variants,
                            varlen) is None


@pytest.mark.parametrize("group,causal,deterministic,delta_given,launches", [
    (8, True, False, False, [("dq", True), ("dkdv", None)]),  # two kernels: dQ makes Delta
    (8, True, False, True, [("dq", False), ("dkdv", None)]),  # ... unless the caller did
    (4, True, True, False, [("dq", True), ("dkdv", None)]),
    (1, False, False, False, [("row_dot", None), ("dkdv", None)]),  # "dkdv_dq": row_dot first
    (1, False, False, True, [("dkdv", None)]),
])
def test_the_two_kernel_backward_makes_delta_in_its_dq_kernel(monkeypatch, group, causal,
                                                              deterministic, delta_given,
                                                              launches):
    """With a stand-in for the launches (no GPU): the kernels launched in order, with dQ's
    DELTA_FROM_OUT, and the one Delta every launch gets (Out only where dQ reads it)."""
    from cuda import tile as ct

    from cutile_fmha.steps import backward as launcher
    from cutile_fmha.steps.family import DKDV, DQ, ROW_DOT, UNUSED_ARRAY

    families = {"dq": DQ, "dkdv": DKDV, "row_dot": ROW_DOT}
    launched, deltas = [], set()

    def kernel(stream, grid, kernel, arguments):
        name = kernel._pyfunc.__name__
        values = dict(zip(families[name].names, arguments))
        launched.append((name, values.get("DELTA_FROM_OUT")))
        deltas.add(values["Delta"].data_ptr())
        if name == "dq":
            assert (values["Out"] is UNUSED_ARRAY) != values["DELTA_FROM_OUT"]

    monkeypatch.setattr(ct, "launch", kernel)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: deterministic)
    monkeypatch.setattr(launcher, "backward_entry_for", lambda arch: backward_entry_for("sm_90"))
    monkeypatch.setattr(launcher, "device_facts", lambda device: ("sm_90",))
    q, out, do = (torch.randn(1, 8, 256, 128, dtype=torch.bfloat16) for _ in range(3))
    k, v = (torch.randn(1, 8 // group, 256, 128, dtype=torch.bfloat16) for _ in range(2))
    delta = torch.zeros(1, 8, 256) if delta_given else None
    launcher.attention_backward(q, k, v, out, torch.zeros(1, 8, 256), do, causal=causal,
                                delta=delta)
    assert launched == launches
    assert len(deltas) == 1 and (not delta_given or deltas == {delta.data_ptr()})


def test_chunked_backward_launches_each_chunks_rows_and_sums_dk_dv(queries_in_chunks,
                                                                    monkeypatch):
    """The launcher's side of the chunks, with a stand-in for the kernel (no GPU): each
    launch gets one chunk's rows of Q, dO, the LSE, Delta and the float32 dQ, whole K and
    V, and the same float32 dK/dV, which the first chunk writes and the others add to
    (ADD_TO_DKDV)."""
    from cuda import tile as ct

    from cutile_fmha.steps import backward as launcher
    from cutile_fmha.steps.family import DKDV

    chunks, sums = [], set()

    def kernel(stream, grid, kernel, arguments):
        values = dict(zip(DKDV.names, arguments))
        q, do, dq_acc = values["Q"], values["dO"], values["dQAcc"]
        adds = values["ADD_TO_DKDV"]
        chunks.append((q.shape[2], values["Lse"].shape[2], values["Delta"].shape[2],
                       values["K"].shape[2], values["dK"].dtype, adds))
        sums.add((values["dK"].data_ptr(), values["dV"].data_ptr()))
        for gradient, rows in ((values["dK"], q), (values["dV"], do)):
            chunk_sum = rows.float().sum(2, keepdim=True).expand_as(gradient)
            if adds:
                gradient += chunk_sum
            else:
                gradient.copy_(chunk_sum)
        dq_acc += 2 * q.float()

    monkeypatch.setattr(ct, "launch", kernel)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    generator = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, n, 128, generator=generator, dtype=torch.bfloat16)
                   for n in (600, 50, 50, 600))
    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
    tensors = {"Q": q, "K": k, "V": v, "dO": do, "Lse": torch.zeros(1, 2, 600),
               "Delta": torch.zeros(1, 2, 600), "dK": dk, "dV": dv, "dQ": dq, "qk_scale": 0.1,
               "query_offset": 0}
    launcher.launch_gradient_kernels(launcher.BACKWARD_FAMILIES, tensors, causal=False,
                                     entry=queries_in_chunks)
    assert chunks == [(128, 128, 128, 50, torch.float32, False)] + \
        [(128, 128, 128, 50, torch.float32, True)] * 3 + [(88, 88, 88, 50, torch.float32, True)]
    assert len(sums) == 1  # one pair of float32 sums for every chunk
    for got, rows in ((dk, q), (dv, do)):  # float32 sums, rounded once to bfloat16
        want = rows.float().sum(2, keepdim=True).expand_as(got)
        assert torch.allclose(got.float(), want, rtol=1e-2, atol=1e-3)
    assert torch.equal(dq, (2 * q.float()).to(dq.dtype))


def test_exact_head_dims_take_their_own_launch_over_the_head_dims():
    entry = backward_entry_for("sm_90")
    mla = launches_for(entry, 192, 128)
    assert mla["dkdv_dq"] == entry.exact_launches[(192, 128)]["dkdv_dq"] != \
        entry.launches[256]["dkdv_dq"]
    assert mla["dkdv"] == entry.launches[256]["dkdv"]  # the others: D=256's
    assert launches_for(entry, 192, 192) == entry.launches[256]


@pytest.mark.parametrize("head_dim,slice_width", [(320, 320), (704, 704), (768, 384),
                                                  (960, 320), (1024, 512)])
def test_large_head_dim_rule_takes_the_widest_slice_that_divides(head_dim, slice_width):
    launch = DEFAULT.large_head_dim_launch(head_dim)
    assert launch.tiles.tile_v == slice_width and launch.step == 10
    assert fastest_step(DEFAULT, head_dim, causal=True) == 10
