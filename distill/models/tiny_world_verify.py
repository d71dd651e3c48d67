"""`distill tiny-world --verify`: retrain a world, or some of its models, and compare every tensor
with its committed build (`python -m distill.cli tiny-world --help`)."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Collection
from pathlib import Path

import torch

from distill.models.tiny_world import BarsMissed, build, committed_build, only_models
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
        print(
            f"[tiny-world] {name}: {'identical to' if same[name] else 'DIFFERS from'} the committed build",
            flush=True,
        )

    with tempfile.TemporaryDirectory() if work is None else contextlib.nullcontext(work) as tmp:
        try:
            part = {} if only is None else {"only": names, "assets": committed}
            if work is None:
                build(Path(tmp), recipe, force=True, trained=compare, **part)
            else:
                build(Path(work), recipe, install=False, trained=compare, **part)
        except BarsMissed as err:  # the weights are what is compared; the bars were checked at build
            print(f"[tiny-world] note: {err}")
        for name in names:
            if name not in same:  # a build that did not report it
                compare(name, Path(tmp) / name)
    return all(same.values())


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
