"""The layout page (docs/layout.md, "The tree") and the tree agree: every module is listed (by name
or by a glob such as `distill/callbacks/*.py`), every listed path exists, and every page under docs/
is reachable from the README. (Links and commands of the README and docs/: tests/test_docs.py.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"


def _layout() -> list[str]:
    text = LAYOUT.read_text()
    block = text.split("## The tree", 1)[1].split("```", 2)[1].split("\n", 1)[1]  # after ```text
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_every_listed_path_exists():
    missing = [p for p in _layout() if not list(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"docs/layout.md names paths that do not exist: {missing}"


def test_every_module_is_listed():
    listed = _layout()
    modules = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "distill").rglob("*.py") if p.name != "__init__.py"
    )
    unlisted = [m for m in modules if not any(Path(m).match(p) or m == p for p in listed)]
    assert not unlisted, f"modules missing from docs/layout.md's tree: {unlisted}"
    assert re.search(r"^tests/", "\n".join(listed), re.M)
    assert re.search(r"^docs/", "\n".join(listed), re.M)


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = {
        (ROOT / target.split("#", 1)[0]).resolve()
        for target in re.findall(r"\]\(([^)\s]+)\)", readme)
        if not re.match(r"[a-z]+:", target)
    }
    pages = sorted((ROOT / "docs").rglob("*.md"))
    assert pages, "docs/ has no pages"
    unlinked = [str(p.relative_to(ROOT)) for p in pages if p.resolve() not in linked]
    assert not unlinked, f"pages under docs/ that README.md does not link: {unlinked}"


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail to a page under docs/"
