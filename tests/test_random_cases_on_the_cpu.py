"""tests/random_cases.py's attention() cases on the CPU, the kernels replaced by float64
(conftest's kernels_on_the_cpu): what the drop-in hands the kernels (masks and their
alignment, window, softcap, sinks, scale, grouped heads, layouts, empty batches and
lengths) and its autograd and torch.compile wiring, against the cases' own reference.
The kernels themselves: tests/test_gpu_random_cases.py."""

import random

import pytest
import torch

import random_cases


@pytest.mark.parametrize("index", range(40))
def test_random_dense_case_is_wired_as_float64_says(index, kernels_on_the_cpu, monkeypatch):
    import cutile_fmha.dropin as dropin

    monkeypatch.setattr(random_cases, "DEVICE", "cpu")
    # the empty calls' device check, which launches would make on the GPU
    monkeypatch.setattr(dropin, "_check_devices", lambda named: None)
    rng = random.Random(f"attention-on-the-cpu-{index}")
    torch.manual_seed(rng.randrange(2 ** 31))
    case, dtype = random_cases.draw_dense(rng)
    random_cases.check(case, dtype, f"attention case {index} on the CPU")
