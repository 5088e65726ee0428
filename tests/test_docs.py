"""Every relative link and image in the Markdown documents points at a file of the
repository (tracked, not an ignored build output)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def tracked_paths() -> set[Path]:
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    files = {Path(line) for line in listed.stdout.splitlines()}
    return files | {parent for f in files for parent in f.parents}


@pytest.mark.parametrize("document", DOCUMENTS)
def test_relative_links_point_at_tracked_files(document):
    tracked = tracked_paths()
    folder = Path(document).parent
    for target in LINK.findall((ROOT / document).read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # a web address or an anchor in the same document
        resolved = Path(os.path.normpath(folder / target.split("#")[0]))
        assert resolved in tracked, f"{document} links to {target}, which git does not track"
