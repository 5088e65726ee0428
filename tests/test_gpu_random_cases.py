"""tests/random_cases.py's cases on the GPU: 16 per entry point by default,
`CUTILE_FMHA_RANDOM_CASES` / `CUTILE_FMHA_RANDOM_SEED` draw more or others."""

import os
import random

import pytest
import torch

from random_cases import DRAWS, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = int(os.environ.get("CUTILE_FMHA_RANDOM_CASES", "16"))
SEED = int(os.environ.get("CUTILE_FMHA_RANDOM_SEED", "0"))


@pytest.mark.parametrize("index", range(CASES))
@pytest.mark.parametrize("entry", list(DRAWS))
def test_random_case_matches_float64(entry, index):
    rng = random.Random(f"{entry}-{SEED}-{index}")
    torch.manual_seed(rng.randrange(2 ** 31))
    case, dtype = DRAWS[entry](rng)
    check(case, dtype, f"{entry} case {index} (seed {SEED})")
