"""The README and the pages under docs/ cannot rot silently.

- Every relative link resolves to a file, and a `#anchor` to a heading of that page.
- Every repository path named in inline code (`configs/...`, `distill/...`, ...) exists, and every
  inline `make TARGET` is a Makefile target.
- Every fenced block says what it holds (bash, yaml, python or text), and
  - every command of a bash block is run or parsed here, by the parser the real command uses:
    `distill fit|validate|test` by LightningCLI (`--print_config`, so nothing is built), `distill
    sweep` by its own parser and the spec loader (the spec is loaded and expanded), `distill report`
    and `distill tiny-world` by theirs, `python -m distill.memory` is run, benchmark scripts' arguments
    by their parsers, `make` targets against the Makefile; the few other programs shown (cd, cat,
    git worktree, sbatch, tensorboard) are checked against what the block itself made (a run
    directory, a job script, a worktree) or what the checkout holds;
  - a yaml block is valid YAML; one whose first line names a file under docs/examples/ is that file,
    a sweep spec is loaded as one, and a config fragment parses over configs/tiny/base.yaml;
  - a python block runs (a block naming a file under docs/examples/ is that file), with the hub
    replaced by the model shapes below.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import io
import os
import re
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)
LANGUAGES = {"bash", "yaml", "python", "text"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(configs|experiments|distill|benchmarks|tests|docs)/[\w./{},*@+-]*$")
GENERATED = ("experiments/runs/",)  # what sweeps write: named in the docs, never committed
EXAMPLE_FILE = re.compile(r"^#.*?\b(docs/examples/[\w./-]+)")
SEPARATORS = {"&&", ";", "||", "|"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _blocks(page: Path) -> list[tuple[str, str]]:
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(page.read_text())]


def _prose(page: Path) -> str:
    return FENCE.sub("", page.read_text())


BLOCKS = [(page, i, lang, body) for page in PAGES for i, (lang, body) in enumerate(_blocks(page))]


def _ids(kind: str) -> tuple[list, list[str]]:
    chosen = [b for b in BLOCKS if b[2] == kind]
    return chosen, [f"{_rel(page)}#{i}" for page, i, _, _ in chosen]


# --- links, paths, make targets in prose -------------------------------------------------------------


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", _prose(page), re.M)}


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+):(?!=)", text, re.M))


def expand_braces(path: str) -> list[str]:
    """`a/{x,y}_b` -> [`a/x_b`, `a/y_b`] (bash brace expansion, as the docs use it)."""
    parts = re.split(r"\{([^{}]*)\}", path)
    options = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(choice) for choice in product(*options)]


def path_exists(path: str) -> bool:
    return all(list(ROOT.glob(p.rstrip("/"))) for p in expand_braces(path))


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target} (no heading with that anchor in {_rel(linked)})")
    assert not broken, f"{_rel(page)}: broken links: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_path_and_make_target_in_prose_exists(page):
    targets, missing = make_targets(), []
    for span in INLINE.findall(_prose(page)):
        words = span.split()
        if words[:1] == ["make"] and len(words) > 1 and not words[1].startswith("-"):
            missing += [f"make {w}" for w in words[1:] if "=" not in w and not fnmatch.filter(targets, w)]
        for word in words:
            word = word.rstrip(".,;:)")
            if "<" in word or word.startswith(GENERATED) or not REPO_PATH.match(word):
                continue
            if not path_exists(word):
                missing.append(word)
    assert not missing, f"{_rel(page)} names what the checkout lacks: {missing}"


def test_every_fenced_block_says_what_it_holds():
    unlabelled = [f"{_rel(page)} block {i}: {lang!r}" for page, i, lang, _ in BLOCKS if lang not in LANGUAGES]
    assert not unlabelled, f"label each fence with one of {sorted(LANGUAGES)}: {unlabelled}"


# --- bash blocks ---------------------------------------------------------------------------------------


def commands(block: str) -> list[list[str]]:
    """The simple commands of a block, as bash splits them (comments dropped, `\\` continued)."""
    out: list[list[str]] = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        current: list[str] = []
        for token in lexer:
            if token in SEPARATORS:
                out.append(current)
                current = []
            else:
                current.append(token)
        out.append(current)
    return [words for words in out if words]


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace):
        self.namespace = namespace


@contextlib.contextmanager
def parse_only():
    """`argparse` parses, then stops the program: its arguments are checked, nothing runs."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        self.allow_abbrev = False  # a doc spells every option out: `--job` for `--jobs` is a typo
        raise Parsed(original(self, args, namespace))

    argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original


def parsed(run, args: list[str]) -> argparse.Namespace:
    err = io.StringIO()
    try:
        with parse_only(), contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            run(args)
    except Parsed as done:
        return done.namespace
    except SystemExit:
        raise AssertionError(f"{args} does not parse: {err.getvalue().strip()}") from None
    raise AssertionError(f"{args}: the program never parsed its arguments")


@dataclass
class Shell:
    """What a block has done so far: its directory, variables, and the paths its commands make."""

    cwd: Path = ROOT
    env: dict[str, str] = field(default_factory=lambda: {"PWD": str(ROOT)})
    made: set[Path] = field(default_factory=set)
    worktrees: set[Path] = field(default_factory=set)

    def expand(self, word: str) -> str:
        def value(m):
            assert m.group(1) in self.env, f"${m.group(1)} is never set in the block"
            return self.env[m.group(1)]

        return re.sub(r"\$(\w+)", value, word)

    def path(self, word: str) -> Path:
        """`word` as an absolute path in the checkout (a worktree the block added stands for it)."""
        path = Path(os.path.normpath(self.cwd / word))
        for tree in self.worktrees:
            if path == tree or tree in path.parents:
                return ROOT / path.relative_to(tree)
        return path

    def known(self, word: str) -> bool:
        path = self.path(word)
        return path.exists() or any(path == m or m in path.parents for m in self.made)


def sweep_outs() -> set[Path]:
    """Where the committed and example sweep specs write."""
    from distill.experiments.run.spec import load_spec

    specs = [*(ROOT / "experiments").glob("*.yaml"), *(ROOT / "docs" / "examples").glob("*sweep*.yaml")]
    here = os.getcwd()
    os.chdir(ROOT)  # a spec's paths are relative to the repository root
    try:
        return {load_spec(p).out for p in specs}
    finally:
        os.chdir(here)


def check_distill(shell: Shell, args: list[str]) -> None:
    assert args, "`distill` without a command"
    command, rest = args[0], args[1:]
    if command in ("fit", "validate", "test"):
        from distill.lightning_cli import run_lightning_cli

        argv = [command, *rest, *([] if "--print_config" in rest else ["--print_config"])]
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                run_lightning_cli(argv)
        except SystemExit as exit_info:
            assert exit_info.code in (0, None), f"distill {' '.join(args)}: {err.getvalue().strip()}"
        printed = yaml.safe_load(out.getvalue())
        assert isinstance(printed, dict) and printed.get("model"), (
            f"distill {' '.join(args)} printed no config"
        )
        if "--run_dir" in rest:
            shell.made.add(shell.path(rest[rest.index("--run_dir") + 1]))
        return
    if command == "sweep":
        from distill.experiments.run import sweep
        from distill.experiments.run.fit_env import device_groups
        from distill.experiments.run.spec import expand, load_spec

        ns = parsed(sweep.main, rest)
        spec = load_spec(shell.path(str(ns.spec)), out=ns.out)
        assert expand(spec), f"{ns.spec} expands to no runs"
        if ns.devices:
            device_groups(ns.devices, ns.jobs)
        shell.made.add(spec.out)
        for made in (ns.emit_slurm, ns.archive):
            if made is not None:
                shell.made.add(shell.path(str(made)))
        return
    if command == "report":
        from distill.experiments.report import report

        ns = parsed(report.main, rest)
        if ns.claims is not None:  # a claims file: it loads
            from distill.experiments.run.claims import load_claims

            load_claims(shell.path(str(ns.claims)))
        if ns.sweep_dir is None:
            assert ns.claims is not None, "distill report: neither SWEEP_DIR nor --claims"
            return
        where = shell.path(str(ns.sweep_dir))
        assert shell.known(str(ns.sweep_dir)) or where in sweep_outs(), (
            f"distill report {ns.sweep_dir}: neither in the checkout nor where a sweep spec writes"
        )
        return
    if command == "tiny-world":
        from distill.models import tiny_world

        parsed(tiny_world.main, rest)
        return
    raise AssertionError(f"`distill {command}` is not a distill command")


def check_script(shell: Shell, script: str, args: list[str]) -> None:
    path = shell.path(script)
    assert path.is_file() and ROOT / "benchmarks" in path.parents, f"{script}: not a benchmark script"
    sys.path.insert(0, str(path.parent))
    saved = sys.argv
    sys.argv = [str(path), *args]
    try:
        parsed(lambda _: runpy.run_path(str(path), run_name="__main__"), args)
    finally:
        sys.argv = saved
        sys.path.remove(str(path.parent))


def check_command(shell: Shell, words: list[str]) -> None:
    words = [shell.expand(w) for w in words]
    while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # VAR=value before a command
        name, _, value = words.pop(0).partition("=")
        shell.env[name] = value
    if not words:
        return
    program, args = words[0], words[1:]
    program = program.split("/.venv/bin/")[-1].removeprefix(".venv/bin/")
    if program in ("python", "python3", "python3.11"):
        if args[:2] == ["-m", "distill.cli"]:
            return check_distill(shell, args[2:])
        if args[:2] == ["-m", "distill.memory"] and len(args) == 2:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                runpy.run_module("distill.memory", run_name="__main__", alter_sys=False)
            assert "per GPU, GB" in out.getvalue()
            return
        if args[:2] == ["-m", "distill.real_teacher"]:  # parsed, not run: it trains for an hour
            from distill.real_teacher import parser

            parser().parse_args(args[2:])
            return
        assert args and args[0].endswith(".py"), f"python {args}: not a command this test checks"
        return check_script(shell, args[0], args[1:])
    if program == "bash":
        assert args and args[0].endswith(".sh"), f"bash {args}: not a command this test checks"
        script = shell.path(args[0])
        assert script.is_file(), f"{args[0]} does not exist"
        return check_script(shell, str(script.with_suffix(".py")), args[1:])
    if program == "distill":
        return check_distill(shell, args)
    if program == "make":
        unknown = [a for a in args if "=" not in a and not a.startswith("-") and a not in make_targets()]
        assert not unknown, f"make: no such targets {unknown}"
        return
    if program == "tensorboard":
        flags = args[0::2]
        assert set(flags) <= {"--logdir", "--logdir_spec"} and len(args) % 2 == 0, f"tensorboard {args}"
        return
    if program == "cat":
        missing = [a for a in args if not shell.known(a)]
        assert not missing, f"cat: {missing} neither exist nor are written by the block's commands"
        return
    if program == "sbatch":
        assert len(args) == 1 and shell.path(args[0]) in shell.made, (
            f"sbatch {args}: not a job script written above"
        )
        return
    if program == "cd":
        assert len(args) == 1 and shell.known(args[0]), f"cd {args}: no such directory"
        shell.cwd = Path(os.path.normpath(shell.cwd / args[0]))
        return
    if program == "git" and args[:2] == ["worktree", "add"]:
        rest = [a for a in args[2:] if a != "--detach"]
        assert len(rest) == 2, f"git worktree add {args[2:]}: expected PATH REVISION"
        if (ROOT / ".git").exists() and not (ROOT / ".git" / "shallow").exists():
            found = subprocess.run(
                ["git", "rev-parse", "--verify", "--quiet", f"{rest[1]}^{{commit}}"],
                cwd=ROOT,
                capture_output=True,
            )
            assert found.returncode == 0, f"git worktree add: {rest[1]} is not a commit of this repository"
        shell.worktrees.add(Path(os.path.normpath(shell.cwd / rest[0])))
        return
    raise AssertionError(f"`{' '.join(words)}`: not a command this test knows how to check")


BASH, BASH_IDS = _ids("bash")


@pytest.mark.parametrize(("page", "index", "lang", "body"), BASH, ids=BASH_IDS)
def test_every_shell_command_runs_or_parses(page, index, lang, body, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path))  # `tiny-world:` names resolve without a build
    monkeypatch.setattr(sys, "path", list(sys.path))
    shell = Shell()
    found = commands(body)
    assert found, f"{_rel(page)} block {index} holds no command"
    for words in found:
        env_path = [w.split("=", 1)[1] for w in words if w.startswith("PYTHONPATH=")]
        for entry in env_path:  # PYTHONPATH=dir distill ...: import from there too
            sys.path.insert(0, str(shell.path(shell.expand(entry))))
        try:
            check_command(shell, words)
        except AssertionError as err:
            raise AssertionError(f"{_rel(page)} block {index}: `{' '.join(words)}`: {err}") from None


# --- yaml and python blocks ----------------------------------------------------------------------------


def example_file(body: str) -> Path | None:
    first = body.splitlines()[0] if body.strip() else ""
    found = EXAMPLE_FILE.match(first)
    return ROOT / found.group(1) if found else None


YAML, YAML_IDS = _ids("yaml")


@pytest.mark.parametrize(("page", "index", "lang", "body"), YAML, ids=YAML_IDS)
def test_every_yaml_block_is_what_it_says(page, index, lang, body, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    data = yaml.safe_load(body)
    example = example_file(body)
    if example is not None:
        assert example.is_file(), f"{_rel(page)} block {index} shows {_rel(example)}, which does not exist"
        assert body == example.read_text(), f"{_rel(page)} block {index} differs from {_rel(example)}"
    if isinstance(data, dict) and "axes" in data:  # a sweep spec
        from distill.experiments.run.spec import parse_spec

        parse_spec(data, root=ROOT)
    elif isinstance(data, dict) and set(data) <= {"model", "data", "trainer", "seed_everything", "base"}:
        from distill.lightning_cli import run_lightning_cli

        data.pop("base", None)
        config = "configs/tiny/base.yaml" if example is None else _rel(example)
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli(["fit", "--config", config, "--config", yaml.safe_dump(data), "--print_config"])
        assert exit_info.value.code in (0, None), capsys.readouterr().err
    elif isinstance(data, list):  # a list of callbacks: each class imports
        import importlib

        for item in data:
            module, _, name = item["class_path"].rpartition(".")
            assert hasattr(importlib.import_module(module), name), item["class_path"]
    else:
        raise AssertionError(f"{_rel(page)} block {index}: neither a spec, a config nor a callback list")


# The shapes of the hub models the docs' python blocks name (their config.json), so they run offline.
HUB_SHAPES = {
    # name: (family, layers, hidden, heads, kv_heads, intermediate, vocab, tied, max_positions)
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2", 24, 896, 14, 2, 4864, 151936, True, 32768),
}

PYTHON, PYTHON_IDS = _ids("python")


@pytest.mark.parametrize(("page", "index", "lang", "body"), PYTHON, ids=PYTHON_IDS)
def test_every_python_block_runs(page, index, lang, body, monkeypatch, capsys):
    import transformers

    from distill.memory import HUB, Architecture

    shapes = {name: arch for name, arch in HUB.items()}
    shapes |= {name: Architecture(name, *values) for name, values in HUB_SHAPES.items()}

    def from_pretrained(name, *args, **kwargs):
        assert name in shapes, f"{name}: add its shapes to tests/test_docs.py's HUB_SHAPES"
        return shapes[name].config()

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", from_pretrained)
    monkeypatch.chdir(ROOT)
    example = example_file(body)
    if example is not None:
        assert example.is_file(), f"{_rel(page)} block {index} shows {_rel(example)}, which does not exist"
        assert body == example.read_text(), f"{_rel(page)} block {index} differs from {_rel(example)}"
    exec(compile(body, f"{_rel(page)}#{index}", "exec"), {"__name__": "docs_block"})


# --- the examples work, not only parse ---------------------------------------------------------------


@pytest.mark.slow
def test_the_extending_examples_train(tiny_world_cache, tmp_path, monkeypatch):
    """docs/extending.md's divergence and measurement in a short fit: the measurement's figure
    reaches metrics.json."""
    import json

    from distill.lightning_cli import run_lightning_cli

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", [str(ROOT / "docs" / "examples"), *sys.path])
    run_dir = tmp_path / "run"
    run_lightning_cli(
        [
            "fit",
            "--config",
            "configs/tiny/first.yaml",  # its measurements are sized for a short fit
            "--run_dir",
            str(run_dir),
            "--model.init_args.divergence",
            "hellinger.SquaredHellinger",
            "--trainer.callbacks+",
            "weight_norm.WeightNorm",
            "--trainer.callbacks.every_n_steps",
            "1",
            "--trainer.max_steps",
            "2",
            "--trainer.val_check_interval",
            "1",
            "--data.batch_size",
            "4",
            "--data.evaluation.val_size",
            "8",
            "--data.evaluation.test_size",
            "8",
            "--data.evaluation.batch_size",
            "8",
            "--data.sampling.max_new_tokens",
            "12",
            "--data.evaluation.max_new_tokens",
            "12",
            "--data.train_size",
            "64",
        ]
    )
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["status"] == "finished"
    assert metrics["metrics"]["weights/student_norm"] > 0
