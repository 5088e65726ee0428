"""Every relative link and image in the Markdown documents points at a file of the
repository (tracked, not an ignored build output), and every link to an anchor of the same
document at one of its headings."""

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


def heading_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a document's headings: lower case, punctuation but hyphens
    and underscores dropped, spaces as hyphens, a repeated one suffixed -1, -2, ..."""
    anchors, seen = set(), {}
    for line in text.splitlines():
        heading = re.match(r"#{1,6} (.+)", line)
        if heading:
            slug = re.sub(r"[^\w\- ]", "", heading[1].strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(f"{slug}-{count}" if count else slug)
    return anchors


@pytest.mark.parametrize("document", DOCUMENTS)
def test_anchor_links_point_at_headings_of_the_document(document):
    text = (ROOT / document).read_text()
    anchors = heading_anchors(re.sub(r"```.*?```", "", text, flags=re.S))  # not code's comments
    for target in LINK.findall(text):
        if target.startswith("#"):
            assert target[1:] in anchors, f"{document} links to {target}, no heading of it"


def test_heading_anchors_are_githubs():
    assert heading_anchors("## Serving: decoding from a KV cache\n### Tests\n## Tests") == {
        "serving-decoding-from-a-kv-cache", "tests", "tests-1"}
