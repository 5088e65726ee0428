"""The padding-runs launcher (kernels/padding.py): each row's real tokens of a CUDA padding
mask in one launch, never reading the device on the host."""

import cuda.tile as ct
import torch

from ..kernels import padding as kernels
from .family import PADDING_RUNS
from .launcher import current_stream

TILE = 1024  # mask columns per turn of a row's loop
_SETTINGS = PADDING_RUNS.settings({"TILE": TILE})


def padding_runs(mask: torch.Tensor) -> torch.Tensor:
    """(3, batch) int32 of a CUDA mask (batch, length), nonzero on real tokens: per row,
    its first real column, one past its last (both 0 with none), and its status
    (kernels/padding.py's NO_PADDING, ONE_RUN or RUNS)."""
    runs = torch.empty((3, mask.shape[0]), dtype=torch.int32, device=mask.device)
    if mask.shape[0]:
        ct.launch(current_stream(mask.device), PADDING_RUNS.grid({"batch": mask.shape[0]}),
                  kernels.padding_runs, (mask, runs) + _SETTINGS)
    return runs
