"""tests/random_cases.py's cases of the three entry points on the CPU, the kernels replaced
by float64 (conftest's kernels_on_the_cpu and decode_on_the_cpu): what the entry points
hand the kernels (masks and their alignment, window, softcap, sinks, scale, grouped heads,
layouts, empty batches, sequences and lengths, packed tensors, dense and paged caches,
left padding, splits) and their autograd and torch.compile wiring, against the cases' own
reference. The kernels themselves: tests/test_gpu_random_cases.py."""

import random

import pytest
import torch

import random_cases


DRAWS = {"attention": (random_cases.draw_dense, 40),
         "attention_varlen": (random_cases.draw_varlen, 20),
         "attention_with_kvcache": (random_cases.draw_kvcache, 20)}


@pytest.mark.parametrize("entry,index", [(entry, index) for entry, (_, cases) in DRAWS.items()
                                         for index in range(cases)])
def test_random_case_is_wired_as_float64_says(entry, index, kernels_on_the_cpu,
                                              decode_on_the_cpu, monkeypatch):
    import cutile_fmha.dropin as dropin
    import cutile_fmha.varlen as varlen

    monkeypatch.setattr(random_cases, "DEVICE", "cpu")
    # the device checks, which ask for the GPU's tensors
    for module in (dropin, varlen):
        monkeypatch.setattr(module, "_check_devices", lambda named: None)
    rng = random.Random(f"{entry}-on-the-cpu-{index}")
    torch.manual_seed(rng.randrange(2 ** 31))
    draw, _ = DRAWS[entry]
    case, dtype = draw(rng)
    random_cases.check(case, dtype, f"{entry} case {index} on the CPU")
