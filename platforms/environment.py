"""Can this machine run the kernels? One message per problem, each with its fix.

Run it on its own:  python -m cutile_fmha.platforms.environment   (or: cutile-fmha-check)

The launcher runs the same checks before the first launch on a device, so a missing
GPU, an old driver or a mismatched compiler stops with this message instead of a
traceback from deep inside the compiler.
"""

import ctypes
import functools
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

CHECK_COMMAND = "python -m cutile_fmha.platforms.environment"
MIN_DRIVER_CUDA = (13, 0)  # the CUDA version an r580 driver reports
# The first tileiras that builds for sm_90 and every other architecture in the platform
# tables (13.2 has no sm_90 target). pyproject.toml asks for the same lower bound.
MIN_TILEIRAS = (13, 4)
OLDEST_GPU = (8, 0)  # cuTile compiles for compute capability 8.0 (sm_80) and newer
# The packages cuda.tile takes its compiler from; it uses the pip tileiras, and keeps
# CUDA_HOME away from it, only when all three are installed at one major.minor.
PIP_COMPILER_PACKAGES = ("nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm")
INSTALL_COMPILER = "pip install -U " + " ".join(
    f"'{package}>={MIN_TILEIRAS[0]}.{MIN_TILEIRAS[1]}'" for package in PIP_COMPILER_PACKAGES)


class EnvironmentProblem(RuntimeError):
    """The machine cannot run the kernels; the message says why and what to do."""


@dataclass
class Compiler:
    path: str | None  # the tileiras cuda.tile will run, None when there is none
    from_pip: bool
    version: tuple[int, int] | None
    gpu_names: tuple[str, ...]  # the architectures it compiles for ("sm_90", ...)
    # The pip compiler packages installed (name -> version), whether cuda.tile uses them or not.
    pip_versions: dict[str, str] = field(default_factory=dict)

    @property
    def origin(self) -> str:
        return f"{'pip package' if self.from_pip else 'PATH'}: {self.path}"


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    facts: dict[str, str] = field(default_factory=dict)

    def message(self) -> str:
        lines = [f"cuTile FMHA cannot run here ({len(self.problems)} problem"
                 f"{'s' if len(self.problems) != 1 else ''}):"]
        lines += [f"  - {p}" for p in self.problems]
        lines.append(f"Re-check with: {CHECK_COMMAND}")
        return "\n".join(lines)


def _release(text: str) -> tuple[int, int] | None:
    match = re.search(r"release (\d+)\.(\d+)", text)
    return (int(match[1]), int(match[2])) if match else None


def _run(*command: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def _dotted(version: tuple[int, int] | None) -> str:
    return "unknown" if version is None else f"{version[0]}.{version[1]}"


def pip_cuda_tool(name: str) -> str | None:
    """A CUDA tool from its pip package: they install into nvidia/cu13/bin, not on PATH."""
    try:
        import nvidia.cu13
    except ImportError:
        return None
    return shutil.which(name, path=os.path.join(nvidia.cu13.__path__[0], "bin"))


def find_cuda_tool(name: str) -> str | None:
    """A CUDA tool (cuobjdump, nvdisasm, ...) from PATH, else from its pip package."""
    return shutil.which(name) or pip_cuda_tool(name)


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def pip_compiler_versions() -> dict[str, str]:
    """The versions of the pip compiler packages that are installed."""
    versions = {}
    for package in PIP_COMPILER_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def pip_versions_agree(versions: dict[str, str]) -> bool:
    """Whether cuda.tile will use the pip compiler: all three present, one major.minor."""
    return (len(versions) == len(PIP_COMPILER_PACKAGES)
            and len({_major_minor(v) for v in versions.values()}) == 1)


@functools.cache
def find_compiler() -> Compiler:
    """The tileiras cuda.tile would use: the pip package's first, then PATH's."""
    pip_versions = pip_compiler_versions()
    path = pip_cuda_tool("tileiras") if pip_versions_agree(pip_versions) else None
    from_pip = path is not None
    path = path or shutil.which("tileiras")
    if path is None:
        return Compiler(None, False, None, (), pip_versions)
    return Compiler(path, from_pip, _release(_run(path, "--version")), target_archs(path),
                    pip_versions)


def target_archs(tileiras: str) -> tuple[str, ...]:
    """The architectures a tileiras binary builds for ("sm_90", ...), from its --help."""
    return tuple(re.findall(r"=\s*(sm_\d+)\b", _run(tileiras, "--help")))


def capability_of_arch(arch: str) -> tuple[int, int]:
    """"sm_90" -> (9, 0), "sm_121" -> (12, 1): the inverse of arch_of_capability."""
    digits = arch.removeprefix("sm_")
    return int(digits[:-1]), int(digits[-1])


def arch_problem(arch: str, compiler: Compiler) -> str | None:
    """Why `compiler` cannot build for `arch` ("sm_90"), and the fix; None when it can."""
    if capability_of_arch(arch) < OLDEST_GPU:
        return (f"cuTile compiles for compute capability {OLDEST_GPU[0]}.{OLDEST_GPU[1]} "
                f"(sm_{OLDEST_GPU[0]}{OLDEST_GPU[1]}) and newer, not {arch}.")
    if not compiler.gpu_names or arch in compiler.gpu_names:
        return None
    return (f"tileiras {_dotted(compiler.version)} ({compiler.origin}) cannot build for "
            f"{arch}: it builds for {', '.join(compiler.gpu_names)}. Fix: {INSTALL_COMPILER}")


def cuda_home_version(cuda_home: str) -> tuple[int, int] | None:
    """The CUDA release installed at `cuda_home`, read from its nvcc."""
    nvcc = os.path.join(cuda_home, "bin", "nvcc")
    return _release(_run(nvcc, "--version")) if os.path.exists(nvcc) else None


def driver_cuda_version() -> tuple[int, int] | None:
    """The CUDA version the installed driver supports, None without a driver."""
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int()
    if libcuda.cuDriverGetVersion(ctypes.byref(version)) != 0:
        return None
    return version.value // 1000, (version.value % 1000) // 10


def _check_compiler(report: Report, compiler: Compiler) -> None:
    pip_versions = compiler.pip_versions
    if pip_versions and not pip_versions_agree(pip_versions):
        found = ", ".join(f"{package} {pip_versions.get(package, 'missing')}"
                          for package in PIP_COMPILER_PACKAGES)
        fallback = f"tileiras from PATH ({compiler.path})" if compiler.path else "no compiler"
        report.problems.append(
            f"The pip compiler packages do not share one major.minor ({found}), so cuda.tile "
            f"ignores them and uses {fallback}. Fix: {INSTALL_COMPILER}")
        if compiler.path is None:
            return
    if compiler.path is None:
        report.problems.append(
            f"No tileiras compiler found (neither the pip package nor on PATH). "
            f"Install it with: {INSTALL_COMPILER}")
        return
    report.facts["tileiras"] = f"{_dotted(compiler.version)} ({compiler.origin})"
    cuda_home = os.environ.get("CUDA_HOME")
    if compiler.from_pip or not cuda_home:
        return
    # cuda.tile hands CUDA_HOME to a tileiras found on PATH; one from an older CUDA
    # makes it fail with "Return code 5 / failed to compile Tile IR program".
    home_version = cuda_home_version(cuda_home)
    report.facts["CUDA_HOME"] = f"{cuda_home} (CUDA {_dotted(home_version)})"
    if home_version is None or compiler.version is None or home_version < compiler.version:
        report.problems.append(
            f"tileiras {_dotted(compiler.version)} comes from PATH ({compiler.path}) while "
            f"CUDA_HOME={cuda_home} holds CUDA {_dotted(home_version)}; tileiras then fails "
            f"with 'Return code 5 / failed to compile Tile IR program'. Fix: "
            f"`unset CUDA_HOME`, point it at the CUDA that tileiras comes from, or "
            f"{INSTALL_COMPILER} (cuda.tile prefers those and ignores CUDA_HOME).")


def _check_gpu(report: Report, device_index: int | None, compiler: Compiler) -> None:
    import torch

    driver = driver_cuda_version()
    if driver is not None:
        report.facts["driver"] = f"supports CUDA {_dotted(driver)}"
        if driver < MIN_DRIVER_CUDA:
            report.problems.append(
                f"The NVIDIA driver supports CUDA {_dotted(driver)}; cuTile needs driver "
                f"r580 or newer (CUDA {_dotted(MIN_DRIVER_CUDA)}). Update the driver.")
            return
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only"
        report.problems.append(
            f"No CUDA GPU is visible to PyTorch {torch.__version__} ({build} build"
            f"{'' if driver else ', no NVIDIA driver found'}). Run on a machine with an "
            f"NVIDIA GPU, a CUDA build of PyTorch and CUDA_VISIBLE_DEVICES not hiding it.")
        return
    index = torch.cuda.current_device() if device_index is None else device_index
    from . import arch_of_capability, entry_for

    arch = arch_of_capability(*torch.cuda.get_device_capability(index))
    report.facts["gpu"] = f"{torch.cuda.get_device_name(index)} ({arch})"
    report.facts["platform entry"] = entry_for(arch).describe()
    if (problem := arch_problem(arch, compiler)):
        report.problems.append(f"This GPU is {arch}. {problem}")


def check_compiler() -> Report:
    """The compiler half of `check`: all that compiling without a GPU needs."""
    report = Report()
    try:
        import cuda.tile as ct
        report.facts["cuda-tile"] = ct.__version__
    except ImportError as error:
        report.problems.append(f"cuda.tile does not import ({error}). "
                               f"Install it with: pip install -U cuda-tile")
    _check_compiler(report, find_compiler())
    return report


def check(device_index: int | None = None) -> Report:
    """Every problem found on this machine (for `device_index`, or the current GPU)."""
    report = check_compiler()
    _check_gpu(report, device_index, find_compiler())
    return report


@functools.cache
def require_environment(device_index: int) -> None:
    """Raises EnvironmentProblem, with every problem and its fix, if the kernels can't run."""
    report = check(device_index)
    if report.problems:
        raise EnvironmentProblem(report.message())


def main() -> int:
    report = check()
    for name, value in report.facts.items():
        print(f"{name}: {value}")
    if report.problems:
        print(report.message(), file=sys.stderr)
        return 1
    print("OK: cuTile FMHA can compile and run here.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
