"""Train the small-number probe world's teacher (3 x 192, v2's shape) and student (2 x 128) with the
build's own loop, measure each greedy on 200 fresh problems per task, and save them as
OUT/tiny-world-v3/{teacher,student} so that a sizing sweep runs on them with DISTILL_CACHE=OUT.
Run with this folder on PYTHONPATH (its sitecustomize makes the numbers small):
    PYTHONPATH=experiments/probes/tiny_world_v3/small_numbers python .../train_pair.py OUT [teacher_steps] [student_steps]
(LOG, 2026-12-03)"""

import json
import sys
from pathlib import Path

import torch

from distill.models.evaluation import task_accuracy
from distill.models.tiny import char_tokenizer
from distill.models.tiny_world_recipes import ModelRecipe
from distill.models.tiny_world_train import train_model
from distill.tasks import countdown
from distill.tasks.registry import get_task

assert countdown.difficulty("countdown3").high == 20, "run with the small_numbers folder on PYTHONPATH"
OUT = Path(sys.argv[1])
TEACHER_STEPS = int(sys.argv[2]) if len(sys.argv) > 2 else 4000
STUDENT_STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
TEACHER_MIX = (
    ("countdown3", 0.45),
    ("countdown4", 0.25),
    ("countdown_chain", 0.20),
    ("addition", 0.05),
    ("reversal", 0.05),
)
STUDENT_MIX = (
    ("countdown3", 0.14),
    ("countdown4", 0.05),
    ("countdown_chain", 0.05),
    ("addition", 0.41),
    ("reversal", 0.35),
)
RECIPES = {
    "teacher": ModelRecipe(
        layers=3,
        hidden=192,
        heads=4,
        vocab_rows=128,
        steps=TEACHER_STEPS,
        lr=2e-3,
        batch_size=32,
        mixture=TEACHER_MIX,
    ),
    "student": ModelRecipe(
        layers=2, hidden=128, heads=4, vocab_rows=112, steps=STUDENT_STEPS, lr=3e-3, mixture=STUDENT_MIX
    ),
}
MEASURED = (
    ("countdown3", 96),
    ("countdown4", 128),
    ("countdown_chain", 192),
    ("addition", 16),
    ("reversal", 16),
)
torch.set_num_threads(2)
tok = char_tokenizer()
world = OUT / "tiny-world-v3"
results = {}
for name, recipe in RECIPES.items():
    if (world / name / "config.json").exists():
        continue
    model, seconds = train_model(recipe, tok, 0, name, checkpoints=OUT / "ckpt" / name, every=500)
    model.save_pretrained(world / name)
    tok.save_pretrained(world / name)
    figures = {t: task_accuracy(model, tok, get_task(t), get_task(t).rows(200, 0), b) for t, b in MEASURED}
    results[name] = {"recipe": repr(recipe), "train_seconds": seconds, "accuracy": figures}
    print(json.dumps({name: results[name]}), flush=True)
    (OUT / f"{name}.json").write_text(json.dumps(results[name], indent=1))
