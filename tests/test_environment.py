"""The environment check: one message per problem, each saying how to fix it."""

import subprocess
import sys

import pytest
import torch

from cutile_fmha.platforms import environment
from cutile_fmha.platforms.environment import Compiler, EnvironmentProblem, check, find_compiler

PATH_TILEIRAS = Compiler("/opt/cuda-13.4/bin/tileiras", False, (13, 4), ("sm_90", "sm_100"))


@pytest.fixture
def gpu(monkeypatch):
    """Pretend an H100 with an r580 driver is present."""
    monkeypatch.setattr(environment, "driver_cuda_version", lambda: (13, 0))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3")


def use_compiler(monkeypatch, compiler):
    monkeypatch.setattr(environment, "find_compiler", lambda: compiler)


def test_healthy_machine_has_no_problems(gpu, monkeypatch):
    use_compiler(monkeypatch, Compiler("/site/nvidia/cu13/bin/tileiras", True, (13, 4), ("sm_90",)))
    report = check()
    assert report.problems == []
    assert report.facts["gpu"] == "NVIDIA H100 80GB HBM3 (sm_90)"
    assert report.facts["platform entry"].startswith("sm_90 (H100, H200)")


def test_path_tileiras_with_older_cuda_home(gpu, monkeypatch):
    use_compiler(monkeypatch, PATH_TILEIRAS)
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-13.0")
    monkeypatch.setattr(environment, "cuda_home_version", lambda home: (13, 0))
    [problem] = check().problems
    assert "CUDA_HOME=/usr/local/cuda-13.0 holds CUDA 13.0" in problem
    assert "Return code 5" in problem and "unset CUDA_HOME" in problem


def test_path_tileiras_with_matching_cuda_home_is_fine(gpu, monkeypatch):
    use_compiler(monkeypatch, PATH_TILEIRAS)
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda-13.4")
    monkeypatch.setattr(environment, "cuda_home_version", lambda home: (13, 4))
    assert check().problems == []


def test_pip_tileiras_ignores_cuda_home(gpu, monkeypatch):
    use_compiler(monkeypatch, Compiler("/site/nvidia/cu13/bin/tileiras", True, (13, 4), ("sm_90",)))
    monkeypatch.setenv("CUDA_HOME", "/usr/local/cuda-13.0")
    monkeypatch.setattr(environment, "cuda_home_version", lambda home: (13, 0))
    assert check().problems == []


def test_no_tileiras(gpu, monkeypatch):
    use_compiler(monkeypatch, Compiler(None, False, None, ()))
    [problem] = check().problems
    assert "No tileiras compiler found" in problem and environment.INSTALL_COMPILER in problem


def test_the_fix_asks_for_what_pyproject_asks_for():
    from importlib.metadata import requires

    wanted = {f"{package}>={environment.MIN_TILEIRAS[0]}.{environment.MIN_TILEIRAS[1]}"
              for package in environment.PIP_COMPILER_PACKAGES}
    assert wanted <= {r.replace(" ", "") for r in requires("cutile-fmha-playbook")}
    assert environment.INSTALL_COMPILER == ("pip install -U 'nvidia-cuda-tileiras>=13.4' "
                                            "'nvidia-cuda-nvcc>=13.4' 'nvidia-nvvm>=13.4'")


MISMATCHED = {"nvidia-cuda-tileiras": "13.4.92", "nvidia-cuda-nvcc": "13.2.86",
              "nvidia-nvvm": "13.4.92"}


def test_pip_packages_of_different_releases_are_ignored_as_cuda_tile_does(monkeypatch):
    monkeypatch.setattr(environment, "pip_compiler_versions", lambda: dict(MISMATCHED))
    monkeypatch.setattr(environment.shutil, "which", lambda name, path=None: None)
    compiler = find_compiler.__wrapped__()
    assert compiler.path is None and compiler.pip_versions == MISMATCHED


def test_pip_packages_of_different_releases(gpu, monkeypatch):
    use_compiler(monkeypatch, Compiler(None, False, None, (), dict(MISMATCHED)))
    [problem] = check().problems
    assert ("do not share one major.minor (nvidia-cuda-tileiras 13.4.92, nvidia-cuda-nvcc "
            "13.2.86, nvidia-nvvm 13.4.92), so cuda.tile ignores them and uses no compiler") \
        in problem
    assert problem.endswith(environment.INSTALL_COMPILER)


def test_old_driver(gpu, monkeypatch):
    use_compiler(monkeypatch, PATH_TILEIRAS)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(environment, "driver_cuda_version", lambda: (12, 8))
    [problem] = check().problems
    assert "supports CUDA 12.8; cuTile needs driver r580 or newer" in problem


def test_tileiras_without_this_gpus_architecture(gpu, monkeypatch):
    """tileiras 13.2, which a torch that pins CUDA 13.2 drags in, has no sm_90 target."""
    use_compiler(monkeypatch, Compiler("/site/nvidia/cu13/bin/tileiras", True, (13, 2),
                                       ("sm_80", "sm_89", "sm_100", "sm_120")))
    [problem] = check().problems
    assert problem == (
        "This GPU is sm_90. tileiras 13.2 (pip package: /site/nvidia/cu13/bin/tileiras) cannot "
        "build for sm_90: it builds for sm_80, sm_89, sm_100, sm_120. Fix: pip install -U "
        "'nvidia-cuda-tileiras>=13.4' 'nvidia-cuda-nvcc>=13.4' 'nvidia-nvvm>=13.4'")


def test_gpu_older_than_cutile_supports(gpu, monkeypatch):
    use_compiler(monkeypatch, PATH_TILEIRAS)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (7, 5))
    [problem] = check().problems
    assert problem == ("This GPU is sm_75. cuTile compiles for compute capability 8.0 (sm_80) "
                       "and newer, not sm_75.")


def test_no_gpu(monkeypatch):
    monkeypatch.setattr(environment, "driver_cuda_version", lambda: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert any("No CUDA GPU is visible to PyTorch" in p for p in check().problems)


def test_problems_become_one_exception(monkeypatch):
    monkeypatch.setattr(environment, "check", lambda index: environment.Report(["A", "B"]))
    environment.require_environment.cache_clear()
    with pytest.raises(EnvironmentProblem) as raised:
        environment.require_environment(0)
    assert str(raised.value) == ("cuTile FMHA cannot run here (2 problems):\n  - A\n  - B\n"
                                 f"Re-check with: {environment.CHECK_COMMAND}")


def test_the_installed_compiler_is_found_and_read():
    compiler = find_compiler()
    if compiler.path is None:
        pytest.skip("tileiras is not installed")
    assert compiler.version is not None and compiler.version >= environment.MIN_TILEIRAS
    assert "sm_90" in compiler.gpu_names


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_command_line_without_a_gpu_prints_one_message_and_fails():
    done = subprocess.run([sys.executable, "-m", "cutile_fmha.platforms.environment"],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "No CUDA GPU is visible to PyTorch" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout
