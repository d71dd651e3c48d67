"""The README is a short front door, and the layout page agrees with the tree.

- The layout page (docs/layout.md, "The tree"): every module is listed (by name or by a glob such as
  `distill/callbacks/*.py`) and every listed path exists.
- The README: its sections in order, every page under docs/ linked, no table (the verdicts live in
  docs/study.md), no tiny world but the default named; its first fit is a short eager config that
  resolves.
- One spelling of each flag: a model key is written as `--print_config` prints its path, `init_args.`
  included, in the README, docs/, the Makefile and the configs' comments.

(Links and commands of the README and docs/: tests/test_docs.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"
README = ROOT / "README.md"
FIRST_FIT = "configs/tiny/first.yaml"
SECTIONS = ["Two commands", "A first fit", "The result", "Where everything else is"]


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
    lines = README.read_text().splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines; move detail to a page under docs/"
    tables = [line for line in lines if line.startswith("|")]
    assert not tables, "README.md holds a table; tables live under docs/ (the verdicts: docs/study.md)"


def test_the_readme_has_its_sections_in_order():
    headings = re.findall(r"^## (.+)$", README.read_text(), re.M)
    assert headings == SECTIONS


def test_the_verdicts_live_in_the_study_page_not_the_readme():
    assert "<!-- verdicts:" not in README.read_text()
    study = (ROOT / "docs" / "study.md").read_text()
    head = "<!-- verdicts: experiments/claims/v3.yaml beside experiments/claims/v2.yaml -->"
    assert study.count(head) == 1 and "<!-- end verdicts -->" in study.split(head, 1)[1]
    assert "](docs/study.md" in README.read_text()
    makefile = (ROOT / "Makefile").read_text()
    outcome = re.search(r"^outcome:.*\n\t(.+)$", makefile, re.M).group(1)
    assert "docs/study.md" in outcome and "README.md" not in outcome


def test_the_readme_names_the_default_tiny_world_only():
    """The versions are explained once, in docs/tiny-world.md; the README names the default."""
    text = README.read_text()
    others = sorted(set(re.findall(r"\bv[0-9]+\b", text)) - {"v3"})
    assert not others, f"README.md names tiny worlds {others}; leave them to docs/tiny-world.md"
    assert "](docs/tiny-world.md)" in text


def _model_init_args(printed: dict) -> dict:
    """Every key under model.init_args, nested groups (an `execution:` block, say) flattened."""
    out: dict = {}
    stack = [printed["model"]["init_args"]]
    while stack:
        node = stack.pop()
        for key, value in node.items():
            out.setdefault(key, value)
            if isinstance(value, dict) and "class_path" not in value:
                stack.append(value)
    return out


def test_the_first_fit_is_short_eager_and_resolves(capsys, monkeypatch):
    """The README's first fit (about 2 minutes on 2 cores, measured) resolves with
    `--print_config`, with the learning-rate flag as the README spells it; it compiles nothing (a
    compile costs 30-90 s a process), runs few steps and tests few problems."""
    from distill.lightning_cli import run_lightning_cli

    text = README.read_text()
    assert f"distill fit --config {FIRST_FIT} " in text
    assert "--model.init_args.optimizer.init_args.lr 1.0e-4" in text
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            [
                "fit",
                "--config",
                FIRST_FIT,
                "--model.init_args.optimizer.init_args.lr",
                "1.0e-4",
                "--print_config",
            ]
        )
    assert exit_info.value.code in (0, None), capsys.readouterr().err
    printed = yaml.safe_load(capsys.readouterr().out)
    model = _model_init_args(printed)
    assert model["execution"]["compile_decoding"] is False and model["execution"]["compile_forwards"] is False
    assert model["optimizer"]["init_args"]["lr"] == 1.0e-4
    assert printed["trainer"]["max_steps"] <= 100
    evaluation = printed["data"]["evaluation"]
    assert evaluation["test_size"] * len(evaluation["test_tasks"]) <= 500


# Where a flag or key is written for a reader to copy.
SPELLED = [
    README,
    *sorted((ROOT / "docs").rglob("*.md")),
    ROOT / "Makefile",
    *sorted((ROOT / "configs").rglob("*.yaml")),
    ROOT / "benchmarks" / "RESULTS.md",
]
# A model key without its `init_args.`: `model.optimizer...`, or a class-typed group's field read
# straight off it (`divergence.beta`); `--print_config` prints neither.
SHORT_MODEL_KEY = re.compile(
    r"(?<![\w.])-{0,2}model\.(?!init_args\b|class_path\b)\w+"
    r"|(?<![\w])-{0,2}model\.init_args\.(?:optimizer|lr_scheduler|divergence)\.(?!init_args\b|class_path\b)\w+"
)


@pytest.mark.parametrize("path", SPELLED, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_model_flag_is_spelled_one_way(path):
    """`--model.init_args.optimizer.init_args.lr`, never `--model.optimizer.init_args.lr` or
    `--model.optimizer.lr` (the parser takes all three). Comments only in a config; error messages
    the code prints (`model.optimizer: Invalid learning rate`) are quoted as printed."""
    text = path.read_text()
    if path.suffix == ".yaml":
        text = "\n".join(line.split("#", 1)[1] for line in text.splitlines() if "#" in line)
    text = re.sub(r"`model\.\w+: [^`]*`", "", text)  # a quoted error message
    text = re.sub(r"\bmodel\.(forward|safetensors)\b", "", text)  # a method, a file name
    found = sorted(set(SHORT_MODEL_KEY.findall(text)))
    assert not found, (
        f"{path.relative_to(ROOT)}: spell {found} as --print_config prints them (model.init_args.…)"
    )
