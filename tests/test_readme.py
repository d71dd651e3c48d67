"""The README's Layout section and the tree agree: every module is listed (by name or by a glob
such as `distill/callbacks/*.py`), and every listed path exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _layout() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_every_listed_path_exists():
    missing = [p for p in _layout() if not list(ROOT.glob(p.rstrip("/")))]
    assert not missing, f"README Layout names paths that do not exist: {missing}"


def test_every_module_is_listed():
    listed = _layout()
    modules = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "distill").rglob("*.py") if p.name != "__init__.py"
    )
    unlisted = [m for m in modules if not any(Path(m).match(p) or m == p for p in listed)]
    assert not unlisted, f"modules missing from the README's Layout section: {unlisted}"
    assert re.search(r"^tests/", "\n".join(listed), re.M)
