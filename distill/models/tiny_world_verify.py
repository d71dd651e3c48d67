"""`distill tiny-world --verify`: retrain a world, or some of its models, and compare every tensor
with its committed build (`python -m distill.cli tiny-world --help`)."""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from collections.abc import Collection
from pathlib import Path

import torch

from distill.models.tiny_world import BarsMissed, build, committed_build, only_models
from distill.models.tiny_world_folders import read_model_record
from distill.models.tiny_world_quality import quality_key
from distill.models.tiny_world_recipes import V2, Recipe


def verify(
    recipe: Recipe = V2,
    committed: Path | None = None,
    work: Path | None = None,
    only: Collection[str] | None = None,
) -> bool:
    """Retrain `recipe` from scratch and check that every weight equals the committed build's: in a
    temporary folder, or in `work`, which is kept, so that a verification longer than a session
    resumes there (an interrupted or finished retraining of the recipe in it is continued or
    reused; the committed build is never installed into it). `work` must be new, empty, or a
    verification folder (`VERIFY_MARKER`): a folder holding an installed world would compare the
    committed weights with themselves.

    `only` retrains and compares those models alone, each from the committed model it starts
    from (`init_from`): a whole verification in parts, each part's starting model verified by an
    earlier part (v3's build takes hours, and a verification's machine may not outlive a session)."""
    committed = committed or committed_build(recipe)
    if committed is None or not Path(committed).is_dir():
        raise FileNotFoundError(f"no committed build to compare with ({committed or 'none for this recipe'})")
    committed = Path(committed)
    names = [name for name, _ in recipe.models] if only is None else only_models(recipe, only)
    if work is not None:
        _claim_verify_folder(Path(work))
    from safetensors.torch import load_file

    same: dict[str, bool] = {}

    def compare(name: str, folder: Path) -> None:  # as each model is trained: a mismatch shows early
        ours = load_file(Path(folder) / "model.safetensors")
        theirs = load_file(committed / name / "model.safetensors")
        same[name] = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
        verdict = (
            "identical to the committed build"
            if same[name]
            else f"DIFFERS from the committed build; {_machines(committed / name, folder)}"
        )
        print(f"[tiny-world] {name}: {verdict}", flush=True)

    with tempfile.TemporaryDirectory() if work is None else contextlib.nullcontext(work) as tmp:
        figures: dict = {}
        try:
            part = {} if only is None else {"only": names, "assets": committed}
            if work is None:
                figures = build(Path(tmp), recipe, force=True, trained=compare, **part) or {}
            else:
                figures = build(Path(work), recipe, install=False, trained=compare, **part) or {}
        except BarsMissed as err:  # the weights are what is compared; the bars were checked at build
            print(f"[tiny-world] note: {err}")
            figures = json.loads((Path(tmp) / "quality.json").read_text())
        for name in names:
            if name not in same:  # a build that did not report it
                compare(name, Path(tmp) / name)
    if (committed / "quality.json").is_file():
        theirs = json.loads((committed / "quality.json").read_text())
        for name in [n for n in names if not same[n]]:
            print(figure_table(name, [n for n, _ in recipe.models], theirs, figures, recipe.eval_problems))
    return all(same.values())


def _machines(committed: Path, ours: Path) -> str:
    """Why two models trained from one recipe may differ: what their records say about the machines
    that trained them (a v1 model, or one trained before records named the CPU, has none)."""
    there, here = ((read_model_record(m) or {}).get("machine") for m in (committed, ours))
    if there is None or here is None:
        return (
            f"the {'committed' if there is None else 'retrained'} model does not record its CPU (the other: "
            f"{_cpu(here if there is None else there)}); float kernels differ between kinds of CPU, so its "
            "quality figures are compared below"
        )
    changed = [
        f"{k} {there.get(k)} there, {here.get(k)} here"
        for k in sorted(there | here)
        if there.get(k) != here.get(k)
    ]
    if changed:
        return (
            f"trained with {'; '.join(changed)}: float kernels differ between kinds of CPU and torch builds"
        )
    return (
        f"trained on the same kind of CPU ({_cpu(here)}): the recipe, or the committed model it starts "
        "from, does not reproduce"
    )


def _cpu(machine: dict | None) -> str:
    if not machine:
        return "an unrecorded CPU"
    return f"{machine.get('cpu')} ({machine.get('cpu_capability')}, torch {machine.get('torch')})"


def figure_table(name: str, models: list[str], committed: dict, ours: dict, problems: int) -> str:
    """`name`'s quality figures, committed beside retrained (`models`: the world's, so that
    teacher's figures leave out teacher_es's). An accuracy on the `problems` fresh problems whose
    difference is beyond 3 standard errors of the difference of two such samples is marked `*`: a
    different training outcome, not only a different sample. Shown but never marked: NLLs, the
    teacher's lead and a fine-tuned teacher's gap (differences of two accuracies), and the facts
    splits (counted on a part of the questions, so noisier than the mark assumes)."""
    prefix = quality_key(name) + "_"
    longer = [quality_key(m) + "_" for m in models if quality_key(m).startswith(prefix)]
    rows = [
        f"[tiny-world] {name}'s figures, committed / retrained (* beyond sampling noise of {problems} problems):"
    ]
    for key in sorted(k for k in ours if k.startswith(prefix) and k in committed):
        if any(key.startswith(other) for other in longer):
            continue
        a, b = committed[key], ours[key]
        if key.endswith("_train_seconds") or not isinstance(a, int | float) or not isinstance(b, int | float):
            continue
        if a == b == 0:  # an ability the model was never taught
            continue
        accuracy = (
            not any(part in key for part in ("nll", "_lead_", "_gap", "_facts"))
            and 0 <= min(a, b) <= max(a, b) <= 1
        )
        noise = 3 * math.sqrt((a * (1 - a) + b * (1 - b)) / problems) if accuracy else math.inf
        mark = "*" if abs(b - a) > max(noise, 1 / problems) else " "
        rows.append(f"  {key[len(prefix) :]:32s} {a:8.3f} {b:8.3f} {b - a:+8.3f} {mark}")
    return "\n".join(rows)


VERIFY_MARKER = ".tiny-world-verify"  # in a folder `verify` retrains in: what it holds was trained there


def _claim_verify_folder(work: Path) -> None:
    if work.is_dir() and any(work.iterdir()) and not (work / VERIFY_MARKER).is_file():
        raise ValueError(
            f"--verify --out {work}: the folder holds files a verification did not write (an installed "
            "world there would be compared with itself); allowed: a new or empty folder, or one an "
            "earlier `--verify --out` used"
        )
    work.mkdir(parents=True, exist_ok=True)
    (work / VERIFY_MARKER).write_text("retrained by `distill tiny-world --verify --out`\n")
