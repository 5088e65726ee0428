"""The forward family's description agrees with every kernel it describes."""

import ast
from pathlib import Path

import pytest
import torch

from cutile_fmha.platforms import TileShape
from cutile_fmha.steps import STEPS
from cutile_fmha.steps.family import FORWARD, forward_constants


@pytest.mark.parametrize("step", sorted(STEPS))
def test_every_step_takes_the_family_parameters_in_order(step):
    module = ast.parse(Path(STEPS[step].source_file).read_text())
    [kernel] = [node for node in module.body
                if isinstance(node, ast.FunctionDef) and node.name == "fmha"]
    assert tuple(arg.arg for arg in kernel.args.args) == FORWARD.names


def test_arguments_follow_the_parameter_order_and_refuse_missing_values():
    values = {name: i for i, name in enumerate(FORWARD.names)}
    assert FORWARD.arguments(values) == tuple(range(len(FORWARD.names)))
    del values["Lse"]
    with pytest.raises(KeyError, match="forward kernels take"):
        FORWARD.arguments(values)


def test_grid_is_query_tiles_by_heads_by_batch():
    q = torch.empty(3, 5, 1000, 64, device="meta")
    values = {"Q": q, **forward_constants(64, TileShape(64, 128), causal=True, write_lse=False)}
    assert FORWARD.grid(values) == (16, 5, 3)
