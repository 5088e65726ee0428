"""Invariants of the platform tables and of the ByTarget value built from them."""

import re

import pytest

from cutile_fmha.platforms import (DEFAULT, HEAD_DIMS, PLATFORMS, entry_for, occupancy_by_target)
from cutile_fmha.platforms.entry import SOURCES
from cutile_fmha.platforms.environment import find_compiler

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
