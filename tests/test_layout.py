"""The package's import graph against docs/layout.md's layer table: no import cycle inside
`distill/`, no import against the layer order, every unit in the table; and the sweep and report
code imports neither torch nor Lightning, so `distill sweep` and `distill report` start at once."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "distill"
LAYOUT = ROOT / "docs" / "layout.md"


def layer_table(text: str) -> dict[str, int]:
    """Unit -> layer number, from the markdown table under `## Layers`."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for unit in cells[1].split(","):
                layers[unit.strip().strip("`")] = int(cells[0])
    return layers


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, wherever the import statement sits (module
    level, inside a function, under TYPE_CHECKING). `from a import b` counts as importing the
    module `a.b` when there is one, else `a`."""
    files = {module_name(p, package): p for p in package.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    root = package.name
    graph = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {known(a.name) for a in node.names if a.name.split(".")[0] == root}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != root:
                    continue
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    targets.add(full if full in files else known(source))
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit_of(module: str) -> str:
    """`distill.rollout.sampler` -> `rollout`, `distill.checks` -> `checks`; the root is `distill`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def against_the_order(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    return sorted(
        f"{a} (layer {layers[unit_of(a)]}) imports {b} (layer {layers[unit_of(b)]})"
        for a, targets in graph.items()
        for b in targets
        if unit_of(b) in layers and unit_of(a) in layers and layers[unit_of(b)] > layers[unit_of(a)]
    )


def test_the_table_names_every_unit_once():
    layers = layer_table(LAYOUT.read_text())
    units = {unit_of(m) for m in import_graph(PACKAGE)} - {"distill"}
    assert set(layers) == units, (
        f"docs/layout.md's layer table: missing {sorted(units - set(layers))}, "
        f"not in distill/ {sorted(set(layers) - units)}"
    )


def test_no_import_cycle_inside_the_package():
    found = cycles(import_graph(PACKAGE))
    assert not found, f"import cycles in distill/: {found}"


def test_no_import_against_the_layer_order():
    bad = against_the_order(import_graph(PACKAGE), layer_table(LAYOUT.read_text()))
    assert not bad, "imports against docs/layout.md's layer order:\n" + "\n".join(bad)


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    package = tmp_path / "distill"
    for name, text in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    for sub in {p.parent for p in package.rglob("*.py")} - {package}:
        (sub / "__init__.py").touch()
    return package


def test_the_checks_see_cycles_and_upward_imports_wherever_the_import_is(tmp_path):
    package = _package(
        tmp_path,
        {
            "base.py": "def f():\n    from distill.top import g\n",  # a function-local import
            "top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import base\n",
            "rollout/a.py": "from distill.rollout import b\n",
            "rollout/b.py": "import distill.rollout.a\n",
        },
    )
    graph = import_graph(package)
    assert graph["distill.base"] == {"distill.top"} and graph["distill.top"] == {"distill.base"}
    assert cycles(graph) == [["distill.base", "distill.top"], ["distill.rollout.a", "distill.rollout.b"]]
    layers = {"base": 1, "rollout": 2, "top": 3}
    assert against_the_order(graph, layers) == ["distill.base (layer 1) imports distill.top (layer 3)"]
    table = "## Layers\n\n| layer | units | what |\n|---|---|---|\n| 1 | `base` | x |\n| 2 | `rollout`, `top` | y |\n"
    assert layer_table(table) == {"base": 1, "rollout": 2, "top": 2}


def _experiment_modules() -> list[str]:
    """Every module of `distill.experiments`, its subpackages and their `__init__`s included."""
    return sorted(module_name(p, PACKAGE) for p in (PACKAGE / "experiments").rglob("*.py"))


# `distill.experiments`' subpackages, each importing only those before it (docs/layout.md).
EXPERIMENT_ORDER = ("run", "stats", "report")


def test_experiment_subpackages_import_only_those_before_them():
    graph = import_graph(PACKAGE)
    rank = {f"distill.experiments.{sub}": i for i, sub in enumerate(EXPERIMENT_ORDER)}

    def sub_of(module: str) -> str | None:
        return next((s for s in rank if module == s or module.startswith(s + ".")), None)

    found = {sub_of(m) for m in _experiment_modules()} - {None}
    assert found == set(rank), f"distill.experiments' subpackages {sorted(found)} vs {sorted(rank)}"
    bad = sorted(
        f"{a} imports {b}"
        for a, targets in graph.items()
        if sub_of(a)
        for b in targets
        if sub_of(b) and rank[sub_of(b)] > rank[sub_of(a)]
    )
    assert not bad, "imports against distill.experiments' order run < stats < report:\n" + "\n".join(bad)


def test_the_experiments_docstring_indexes_every_module():
    import distill.experiments as experiments

    index = experiments.__doc__ or ""
    named = [m.removeprefix("distill.experiments.") for m in _experiment_modules() if m.count(".") == 3]
    missing = [m for m in named if f"`{m}`" not in index]
    assert not missing, f"distill/experiments/__init__.py's index misses {missing}"

def test_sweep_and_report_code_imports_no_framework():
    frameworks = ["torch", "lightning", "transformers"]
    modules = ["distill.cli", *_experiment_modules()]
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(sorted(f for f in {frameworks!r} if f in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]", f"importing {modules} loads {out.stdout.strip()}"


# A reference to another project's tracker names the project ("TRL issue #4719"); ours stay in the
# LOG and the commit messages. Claims files are declarations, frozen at the commit that made them.
_UPSTREAM = ("TRL", "Lightning", "PyTorch", "vLLM", "transformers", "jsonargparse")
_HISTORY = re.compile(
    r"(?<!\w)(?:(?P<who>\w+) )?(?:issue|session|stop|round) #?\d+\b"
    r"|\b(?:\w+teenth|twelfth|eleventh|tenth|ninth|eighth|seventh|sixth|fifth|fourth|third|second|first)"
    r" sessions?\b",
    re.IGNORECASE,
)
_CODE = ("distill", "tests", "benchmarks", "experiments")


def history_lines(text: str) -> list[str]:
    """The lines of `text` that narrate the project's history (our issue, session or stop numbers)."""
    found = []
    for line in text.splitlines():
        for match in _HISTORY.finditer(line):
            if match.group("who") not in _UPSTREAM:
                found.append(line.strip())
                break
    return found


def test_no_code_narrates_history():
    paths = [
        p
        for top in _CODE
        for p in sorted((ROOT / top).rglob("*"))
        if p.suffix in {".py", ".yaml", ".sh"} and "claims" not in p.parts and p != Path(__file__)
    ]
    found = {str(p.relative_to(ROOT)): lines for p in paths if (lines := history_lines(p.read_text()))}
    assert not found, f"history in code (it belongs in experiments/LOG.md or a commit message): {found}"


def test_the_history_check_sees_what_it_should():
    assert history_lines("x = 1  # issue 31, item 6: why\n# the fourteenth session's probe\nok")
    assert len(history_lines("a (Issue #12)\nb stop 42\nc\n")) == 2
    assert not history_lines("per micro-batch mean (TRL issue #4719)\n# 2 rounds of 3 steps\n")
