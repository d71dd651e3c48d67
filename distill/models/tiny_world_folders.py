"""What a tiny-world build folder records, so that a build resumes and a world is recognised: the
recipe as JSON (`quality.json`), each model's stamp (everything that determines its weights) in
`tiny_world.json` beside it, its training checkpoints under `.checkpoints/NAME` while it trains,
and whole-folder swaps, so that an interrupted build never leaves half a model."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

from transformers import LlamaForCausalLM

from distill.models.tiny_world_recipes import ModelRecipe, Recipe
from distill.models.tiny_world_train import corpus_digest
from distill.runinfo import replace_atomic, write_json_atomic


def model_json(model: ModelRecipe) -> dict:
    record = json.loads(json.dumps(asdict(model)))
    if record["style_rate"] == 1.0:  # the default, left out: records and stamps made before the field
        del record["style_rate"]
    return record


def recipe_json(recipe: Recipe) -> dict:
    record = json.loads(json.dumps(asdict(recipe)))
    if record["measured"] is None:  # v1/v2 (committed before the field): their records as built
        del record["measured"]
    record["models"] = [[name, model_json(model)] for name, model in recipe.models]
    return record


def is_built(out: Path, recipe: Recipe) -> bool:
    try:
        quality = json.loads((out / "quality.json").read_text())
    except (OSError, ValueError):
        return False
    return (
        quality.get("recipe") == recipe_json(recipe)
        and not quality.get("failed_bars")
        and all((out / m / "config.json").exists() for m, _ in recipe.models)
    )


MODEL_RECORD = "tiny_world.json"  # beside each trained model: what made it, how long it took


def stamp_of(recipe: Recipe, name: str) -> dict:
    """Everything that determines a model's weights: its recipe and those of the models it starts
    from, what each read (`corpus_digest`), the seed and the thread count."""
    chain, current = {}, name
    while current is not None:
        chain[current] = model_json(recipe.model(current))
        current = recipe.model(current).init_from
    corpus = {m: corpus_digest(recipe.model(m), recipe.seed) for m in chain}
    return {"name": name, "models": chain, "corpus": corpus, "seed": recipe.seed, "threads": recipe.threads}


def read_model_record(folder: Path) -> dict | None:
    """The record beside a trained model (`MODEL_RECORD`), or None when it is missing or unreadable."""
    try:
        record = json.loads((folder / MODEL_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def record_matches(folder: Path, stamp: dict) -> bool:
    """`folder` holds a complete model trained from `stamp` (an earlier build's, kept on resume)."""
    record = read_model_record(folder)
    return (
        record is not None
        and record.get("stamp") == stamp
        and all((folder / f).is_file() for f in ("config.json", "model.safetensors"))
    )


def finished_model(folder: Path, stamp: dict):
    """(model, train seconds) when `folder` holds a model trained from `stamp`, else None."""
    if not record_matches(folder, stamp):
        return None
    record = json.loads((folder / MODEL_RECORD).read_text())
    model = LlamaForCausalLM.from_pretrained(folder)
    return model.eval(), float(record.get("train_seconds", 0.0))


CHECKPOINTS = ".checkpoints"  # out/.checkpoints/NAME: a model's training state while it trains


def unfinished(out: Path, recipe: Recipe) -> bool:
    """`out` holds models or training state of an interrupted or failed build of `recipe`."""
    for name, _ in recipe.models:
        stamp = stamp_of(recipe, name)  # once a model: it reads the model's corpus
        if record_matches(out / name, stamp) or checkpoint_matches(out, name, stamp):
            return True
    return False


def checkpoint_matches(out: Path, name: str, stamp: dict) -> bool:
    """`out` holds training state of `name` from a build with the same stamp (an interrupted one)."""
    try:
        record = json.loads((out / CHECKPOINTS / name / MODEL_RECORD).read_text())
    except (OSError, ValueError):
        return False
    return record.get("stamp") == stamp


def checkpoint_folder(out: Path, name: str, stamp: dict, force: bool) -> Path:
    """The folder `name` checkpoints into: one of the same stamp (recipe, corpus, seed, threads)
    is resumed; any other, or any with `force`, is emptied first."""
    folder = out / CHECKPOINTS / name
    if force or not checkpoint_matches(out, name, stamp):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        write_json_atomic(folder / MODEL_RECORD, {"stamp": stamp})
    return folder


def replace_dir(target: Path, fill) -> None:
    """Fill a temporary folder, then swap it in: an interrupted build never leaves a half model."""
    replace_atomic(target, fill)
