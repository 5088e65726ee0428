"""The README's install command, resolved today as a new user's pip resolves it.

A dry run (`pip install --dry-run --report`, nothing of torch's gigabytes downloaded) in a
fresh virtual environment, with nothing of this machine's pip set-up, for every pip call
made here:
- no configuration file at all, global, user or site. `PIP_CONFIG_FILE` is the null device,
  the one switch pip honours for all three: `--isolated` alone skips the user's file but
  still reads the global one (/etc/pip.conf, /etc/xdg/pip/pip.conf), which may carry a
  constraint capping torch below its newest release;
- no `PIP_*` variable from this environment (and `--isolated` on top).
So pip sees no local wheel folder, no CPU build of torch and no cap, as on a new user's
machine, and weighs the newest CUDA build of torch against the compiler packages; a test
checks that pip, run this way, reports no configuration.

torch pins its CUDA toolkit (2.15 pins 13.2, whose tileiras has no sm_90 target), so this
fails the day a torch release, a CUDA wheel or one of our own pins makes the install
backtrack torch or resolve to a compiler that cannot build for Hopper, or for any
architecture in the platform tables. The resolved tileiras wheel itself (about 40 MB) is
fetched and asked which architectures it builds for.

Needs the package index; without it (and outside CI) the test skips.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

from cutile_fmha.platforms import PLATFORMS
from cutile_fmha.platforms.environment import MIN_TILEIRAS, PIP_COMPILER_PACKAGES, target_archs

ROOT = Path(__file__).resolve().parents[1]
INDEX = "https://pypi.org/simple/"
TILEIRAS_IN_WHEEL = "nvidia/cu13/bin/tileiras"


def readme_install_arguments() -> list[str]:
    """The arguments of the `pip install` line in the README's "Two commands"."""
    section = (ROOT / "README.md").read_text().split("## Two commands", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    [line] = [line for line in block.splitlines() if line.startswith("pip install ")]
    return shlex.split(line, comments=True)[2:]


def _index_reachable() -> bool:
    try:
        urllib.request.urlopen(INDEX + "torch/", timeout=15).close()
        return True
    except OSError:
        return False


def _new_users_environment() -> dict[str, str]:
    """This process's environment less every PIP_* variable, with all pip configuration
    files switched off."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.upper().startswith("PIP_")}
    return environment | {"PIP_CONFIG_FILE": os.devnull}


def _pip(venv: Path, *args: str, cwd=ROOT) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--isolated",
                           "--disable-pip-version-check", *args],
                          cwd=cwd, env=_new_users_environment(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"pip {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def _major_minor(version: str) -> tuple[int, int]:
    return tuple(int(part) for part in version.split(".")[:2])


@pytest.fixture(scope="module")
def resolution(tmp_path_factory):
    """For the README's command: (version by package, requires_dist by package, the fresh
    venv, a scratch folder)."""
    if not os.environ.get("CI") and not _index_reachable():
        pytest.skip(f"the package index ({INDEX}) is not reachable")
    folder = tmp_path_factory.mktemp("fresh-install")
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    report = folder / "report.json"
    _pip(venv, "install", "--dry-run", "--ignore-installed", "--quiet", "--report",
         str(report), *readme_install_arguments())
    installs = json.loads(report.read_text())["install"]
    versions = {item["metadata"]["name"].lower(): item["metadata"]["version"] for item in installs}
    requires = {item["metadata"]["name"].lower(): item["metadata"].get("requires_dist", [])
                for item in installs}
    return versions, requires, venv, folder


def test_pip_runs_with_no_configuration(resolution):
    """Neither a file (a cap on torch, a local wheel folder) nor a variable reaches pip."""
    _, _, venv, _ = resolution
    assert _pip(venv, "config", "list").strip() == ""


def test_readme_install_line_is_the_editable_project_with_plots():
    assert readme_install_arguments() == ["-e", ".[plots]"]


def test_resolves_the_newest_cuda_torch(resolution):
    versions, requires, venv, _ = resolution
    listed = _pip(venv, "index", "versions", "torch", "--index-url", INDEX)
    newest = re.search(r"torch \(([^)]+)\)", listed)[1]
    assert versions["torch"] == newest, \
        f"pip backtracked torch to {versions['torch']} (newest: {newest}): {versions}"
    assert any("cuda" in r.lower() or "nvidia" in r.lower() for r in requires["torch"]), \
        f"torch {versions['torch']} is not a CUDA build: {requires['torch']}"


def test_compiler_packages_share_one_release_that_builds_for_hopper(resolution):
    versions, _, _, _ = resolution
    found = {package: versions.get(package) for package in PIP_COMPILER_PACKAGES}
    assert None not in found.values(), f"a compiler package is not installed: {found}"
    releases = {_major_minor(version) for version in found.values()}
    assert len(releases) == 1, f"cuda.tile ignores compiler packages of different releases: {found}"
    assert releases.pop() >= MIN_TILEIRAS, f"tileiras older than {MIN_TILEIRAS}: {found}"


def test_resolved_tileiras_builds_for_every_table_architecture(resolution):
    versions, _, venv, folder = resolution
    wheels = folder / "wheels"
    _pip(venv, "download", "--no-deps", "--quiet", "--dest", str(wheels), "--index-url", INDEX,
         f"nvidia-cuda-tileiras=={versions['nvidia-cuda-tileiras']}")
    [wheel] = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(TILEIRAS_IN_WHEEL, folder)
    tileiras = folder / TILEIRAS_IN_WHEEL
    tileiras.chmod(0o755)
    archs = target_archs(str(tileiras))
    assert "sm_90" in archs and set(PLATFORMS) <= set(archs), \
        f"tileiras {versions['nvidia-cuda-tileiras']} builds for {archs} only"
