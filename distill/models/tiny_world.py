"""`distill tiny-world`: build the CPU model organism, a small family of char-level Llama models.

Each version has its own folder, `$DISTILL_CACHE/tiny-world-VERSION`, and configs name its models
`tiny-world-VERSION:NAME`; `tiny-world:NAME` is the default version's (`tiny_world_names`).

v3 (the default): a teacher competent on the held-out harder variants and the long chain, a student
off the floor there, a `teacher-es` whose style is a probability, and a knowledge pair whose
student knows its share of the facts (docs/tiny-world.md has each model's measured figures).

v2 (`tiny-world-v2:NAME`, `--version v2`): `teacher` and `student` learn from one shared corpus
written in one plain style (Countdown-3 and -4 solutions, addition, reversal), as a hub model
family is pretrained on the same text. The teacher is larger and trained longer on Countdown; the
student is smaller, weak at Countdown and good at its prior abilities. Because the teacher has seen
text like the student's, it is a sensible judge of whatever the student writes. `teacher-es` is the
teacher briefly fine-tuned to reason with Spanish connectives, for the style-transfer experiment
only. `teacher-sci` and `student-sci` are the pair fine-tuned on the knowledge domain
(`distill.tasks.tinysci`, questions about made-up creatures): the teacher on every fact, the
student on about a quarter of them, both still practising Countdown and the prior abilities. The
study archived under experiments/results/ ran on v2.

v1 (`tiny-world-v1:NAME`, `--version v1`): the first organism, whose teacher only ever wrote the
Spanish style. It could not judge the student's plain text, and distillation made the student
worse in 59 of 60 runs (experiments/LOG.md); it stays as the mismatched-teacher variant.

    distill tiny-world                       # v3 into $DISTILL_CACHE/tiny-world-v3 (seconds: committed build)
    distill tiny-world --version v2          # v2 into $DISTILL_CACHE/tiny-world-v2
    distill tiny-world --version v1          # v1 into $DISTILL_CACHE/tiny-world-v1
    distill tiny-world --force               # retrain v3 (hours on 2 cores; resumes if cut short)
    distill tiny-world --version v2 --force  # retrain v2 (46 min on 2 AVX2 cores; resumes if cut short)
    distill tiny-world --version v2 --verify # retrain in a temporary folder, compare every tensor
    distill tiny-world --verify --out DIR    # the same in DIR, kept: a rerun resumes a verification cut short
    distill tiny-world --verify --out DIR --only teacher-sci,student-sci  # those alone, from the committed models they start from
    distill tiny-world --quick --out /tmp/tw # a low-quality world in under a minute (tests)

Every model is trained with Lightning from a fixed seed, saved with `save_pretrained` beside the
char tokenizer, and loadable offline with the `Auto*` classes. Embeddings are padded past the
tokenizer (128 and 112 rows for 104 tokens), as real checkpoints' are. The build prints its
progress (and writes it to `build.log`), measures every model (`quality.json`), and fails if a
validity bar of the recipe is missed.

The recipes live in `tiny_world_recipes.py`, the training of one model in `tiny_world_train.py`,
the quality figures in `tiny_world_quality.py`; this module builds, installs and verifies
(`--verify`: retrain a world, or some of its models, and compare every tensor with its committed
build).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Collection
from pathlib import Path

import torch

from distill.models.tiny import char_tokenizer
from distill.models.tiny_world_folders import (
    MODEL_RECORD,
    checkpoint_folder,
    finished_model,
    is_built,
    read_model_record,
    recipe_json,
    replace_dir,
    stamp_of,
    unfinished,
)
from distill.models.tiny_world_names import (
    DEFAULT_VERSION,
    LEGACY_FOLDER,
    assets_dir,
    cache_root,
    default_dir,
)
from distill.models.tiny_world_quality import measure_family, measure_model, quality_key
from distill.models.tiny_world_recipes import COMMITTED, QUICK, V1, V2, V3, VERSIONS, Bar, ModelRecipe, Recipe
from distill.models.tiny_world_train import CHECKPOINT_EVERY, Log, duration, train_model
from distill.runinfo import machine, write_json_atomic

__all__ = [
    "QUICK",
    "V1",
    "V2",
    "V3",
    "VERSIONS",
    "DEFAULT_VERSION",
    "Bar",
    "ModelRecipe",
    "Recipe",
    "assets_dir",
    "build",
    "default_dir",
    "main",
]


def committed_build(recipe: Recipe) -> Path | None:
    """The committed build of a full recipe (None for others, e.g. `QUICK`)."""
    return next((assets_dir(v) for v, r in VERSIONS.items() if r == recipe and v in COMMITTED), None)


def world_of(model_dir: str | Path) -> dict | None:
    """Which tiny world a model directory belongs to, for a run's record (`env.json`): the world's
    version (`v3`, `v2`, `v1`, `quick`, else `custom`: the recipe in its `quality.json` is none of the
    named ones), the model's name in it and a fingerprint of its weights (the first 16 hex digits
    of the SHA-256 of `model.safetensors`). None for a directory outside a tiny world."""
    folder = Path(model_dir)
    try:
        quality = json.loads((folder.parent / "quality.json").read_text())
        weights = (folder / "model.safetensors").read_bytes()
    except (OSError, ValueError):
        return None
    named = {**VERSIONS, "quick": QUICK}
    version = next((v for v, r in named.items() if quality.get("recipe") == recipe_json(r)), "custom")
    return {"version": version, "model": folder.name, "fingerprint": hashlib.sha256(weights).hexdigest()[:16]}


# --- building ------------------------------------------------------------------------------------


class BarsMissed(RuntimeError):
    """The build finished but a validity bar of its recipe does not hold (see quality.json)."""


def build(
    out: Path,
    recipe: Recipe = V2,
    force: bool = False,
    assets: Path | None = None,
    every: datetime.timedelta | int = CHECKPOINT_EVERY,
    install: bool = True,
    trained: Callable[[str, Path], None] | None = None,
    only: Collection[str] | None = None,
) -> dict:
    """Build (or reuse) a tiny world in `out`; returns the quality figures.

    Without `force`, a world already in `out` with the same recipe is reused, a recipe with a
    committed build (`assets`, byte-identical to what training produces here, see `verify`) is
    installed instead of retrained, unless `out` holds models of an interrupted or failed build of
    this recipe: then the build resumes, and each model already trained in `out` with the same
    recipe, seed and threads (`tiny_world.json` beside it) is loaded, not retrained (`force`
    retrains everything). A model checkpoints its training state every `every` (wall time, or an
    int: optimiser steps) into `out/.checkpoints/NAME`, so a build killed mid-model resumes there
    with the weights an uninterrupted build would have. `install=False` never installs the
    committed build (a resumable `verify` trains every model). `trained(name, folder)` is called as
    each model is saved or reused, before it is measured (`verify` compares it there). After
    training, every bar of the recipe is checked; a missed bar raises `BarsMissed` (the figures stay
    in `quality.json`, marked failed, for inspection).

    `only` (names of the recipe's models) trains and measures those models alone, each one's
    `init_from` model loaded from `assets` (which must hold it, trained from the same recipe), and
    writes no `quality.json`: the folder is not a world. `verify --only` is made of it, so that a
    verification can be split between sessions shorter than the whole build."""
    out = Path(out)
    assets = Path(assets) if assets is not None else committed_build(recipe)
    if only is not None:
        only = only_models(recipe, only)
        install = False
    if only is None and not force and is_built(out, recipe):
        print(f"[tiny-world] reusing {out} (built with the same recipe)")
        return json.loads((out / "quality.json").read_text())
    if (
        install
        and not force
        and not unfinished(out, recipe)
        and assets is not None
        and is_built(assets, recipe)
    ):
        print(f"[tiny-world] installing the committed build into {out} (`--force` retrains it)")
        for extra in ("quality.json", "build.log"):
            (out / extra).unlink(missing_ok=True)
        for name, _ in recipe.models:
            replace_dir(out / name, lambda tmp, name=name: shutil.copytree(assets / name, tmp))
        for extra in ("quality.json", "build.log"):
            if (assets / extra).exists():
                shutil.copyfile(assets / extra, out / extra)
        return json.loads((out / "quality.json").read_text())
    torch.set_num_threads(recipe.threads)
    start = time.time()
    out.mkdir(parents=True, exist_ok=True)
    (out / "quality.json").unlink(missing_ok=True)  # the world is unfinished until it is rewritten
    log = Log(out / "build.log")
    here = machine()
    log(f"building into {out}: {', '.join(n for n, _ in recipe.models)}; {recipe.threads} threads")
    log(f"on {here['cpu']} ({here['cpu_capability']} kernels, torch {here['torch']})")
    tokenizer = char_tokenizer()
    quality: dict = {}
    models: dict = {}
    resumed: list[str] = []
    reused_seconds = 0.0
    for name, model_recipe in recipe.models:
        if only is not None and name not in only:
            if any(r.init_from == name for n, r in recipe.models if n in only):
                models[name] = _committed_parent(assets, recipe, name)
                log(f"{name}: loaded from {assets} (not retrained: only {', '.join(only)} asked for)")
            continue
        stamp = stamp_of(recipe, name)
        done = None if force else finished_model(out / name, stamp)
        if done is not None:  # trained by an earlier, interrupted or failed build with this recipe
            model, seconds = done
            log(f"reusing {name}: trained earlier with the same recipe and seed ({duration(seconds)})")
            resumed.append(name)
            reused_seconds += seconds
        else:
            init = models[model_recipe.init_from] if model_recipe.init_from else None
            checkpoints = checkpoint_folder(out, name, stamp, force)
            model, seconds = train_model(
                model_recipe,
                tokenizer,
                recipe.seed,
                name,
                log,
                init=init,
                checkpoints=checkpoints,
                every=every,
            )
            record = {"stamp": stamp, "train_seconds": seconds, "machine": here}
            replace_dir(
                out / name,
                lambda tmp, model=model, record=record: (
                    model.save_pretrained(tmp),
                    tokenizer.save_pretrained(tmp),
                    write_json_atomic(Path(tmp) / MODEL_RECORD, record),
                ),
            )
            shutil.rmtree(checkpoints)  # the model is saved: its training state is not needed
        if trained is not None:
            trained(name, out / name)
        quality[f"{quality_key(name)}_train_seconds"] = seconds
        models[name] = model
        log(f"measuring {name} ({recipe.eval_problems} fresh problems per task, greedy)")
        quality.update(measure_model(model, tokenizer, name, recipe.eval_problems, log, recipe.measured))
    if only is not None:  # part of a world: no family figures, no bars, no quality.json
        log(f"done with {', '.join(only)} in {duration(time.time() - start)}")
        return quality
    quality.update(measure_family(models, tokenizer, recipe, log, quality))
    # Wall time of the whole build: this run's, plus the recorded training time of reused models.
    quality["build_seconds"] = round(time.time() - start + reused_seconds, 1)
    quality["resumed_models"] = resumed
    quality["threads"] = torch.get_num_threads()
    quality["machine"] = here
    failed = [f"{b} (got {quality[b.key]:.3f})" for b in recipe.bars if not b.holds(quality[b.key])]
    quality["failed_bars"] = failed
    quality["recipe"] = recipe_json(recipe)
    write_json_atomic(out / "quality.json", quality)
    log(f"done in {duration(quality['build_seconds'])}; quality figures in {out / 'quality.json'}")
    log("every validity bar met" if not failed else "FAILED validity bars: " + "; ".join(failed))
    if failed:
        raise BarsMissed(
            f"the tiny world in {out} misses {len(failed)} validity bar(s): " + "; ".join(failed)
        )
    return quality


def only_models(recipe: Recipe, only: Collection[str]) -> list[str]:
    """`only`'s names in the recipe's order; an unknown or empty selection is a ValueError."""
    known = [name for name, _ in recipe.models]
    unknown = [name for name in only if name not in known]
    if unknown or not only:
        raise ValueError(
            f"--only must name some of the world's models, {', '.join(known)}; got "
            + (repr(unknown[0]) if unknown else "none")
        )
    return [name for name in known if name in only]


def _committed_parent(assets: Path | None, recipe: Recipe, name: str):
    """The model `name` of `assets`, trained from `recipe` (what a model of `only` starts from)."""
    found = None if assets is None else finished_model(Path(assets) / name, stamp_of(recipe, name))
    if found is None:
        raise ValueError(
            f"--only: {name}, which a model asked for starts from, is not in {assets} as this recipe "
            "trains it; retrain it too (add it to --only) or verify against the build it belongs to"
        )
    return found[0]


def _note_legacy_folder() -> None:
    legacy = cache_root() / LEGACY_FOLDER
    if legacy.is_dir():
        print(
            f"[tiny-world] note: {legacy} is a v2 build under the old folder name and is not read: "
            f"`tiny-world:` is {DEFAULT_VERSION} ({default_dir()}), v2 is `tiny-world-v2:` ({default_dir('v2')})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distill tiny-world", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: $DISTILL_CACHE/tiny-world-VERSION)"
    )
    parser.add_argument(
        "--version",
        choices=sorted(VERSIONS),
        default=None,
        help=f"which world (default {DEFAULT_VERSION}, what `tiny-world:NAME` names; v2: the archived study's; v1: mismatched teacher)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="a low-quality v2-shaped world in under a minute (for tests)"
    )
    parser.add_argument(
        "--force", action="store_true", help="retrain even if a world with this recipe exists"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="retrain the version's full recipe in a temporary folder (or in --out, kept: a rerun resumes it) "
        "and compare every tensor with the committed build",
    )
    parser.add_argument(
        "--only",
        type=lambda names: [n.strip() for n in names.split(",") if n.strip()],
        default=None,
        metavar="NAME[,NAME]",
        help="with --verify: retrain and compare these models alone, each from the committed model it "
        "starts from (a verification in parts; e.g. teacher, then teacher-es,teacher-sci)",
    )
    args = parser.parse_args(argv)
    if args.only is not None and not args.verify:
        parser.error("--only goes with --verify (a build trains the whole world)")
    version = args.version or DEFAULT_VERSION
    if args.verify:
        if not assets_dir(version).is_dir():
            print(f"[tiny-world] error: {version} has no committed build to verify against", file=sys.stderr)
            return 1
        try:
            return 0 if verify(VERSIONS[version], assets_dir(version), args.out, only=args.only) else 1
        except ValueError as err:
            print(f"[tiny-world] error: {err}", file=sys.stderr)
            return 1
    if args.quick and args.out is None:
        parser.error("--quick needs --out DIR (a random-quality world must not replace the real one)")
    if args.out is None:
        _note_legacy_folder()
    out = args.out or default_dir(version)
    recipe = QUICK if args.quick else VERSIONS[version]
    asked = args.quick or args.version or args.force
    if not (asked or committed_build(recipe) or is_built(out, recipe) or unfinished(out, recipe)):
        # The default world without a committed build: training it takes hours, so only on request.
        print(
            f"[tiny-world] error: {version}, the default world, has no committed build yet: "
            f"`distill tiny-world --version {version}` trains it (hours on a CPU; resumable), "
            "`distill tiny-world --version v2` installs v2 (`tiny-world-v2:` names) in seconds",
            file=sys.stderr,
        )
        return 1
    try:
        quality = build(out, recipe, force=args.force)
    except BarsMissed as err:
        print(f"[tiny-world] error: {err}", file=sys.stderr)
        return 1
    shown = {k: v for k, v in quality.items() if k not in ("recipe", "failed_bars")}
    print(f"[tiny-world] {out}\n" + "\n".join(f"  {k:36s} {v}" for k, v in shown.items()))
    return 0


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
