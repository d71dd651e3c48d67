"""Candidate v3 students: the build's own training (`train_model`) of a student of
`layers` x 128 on a named mixture (the arithmetic drill of `distill.tasks.arithmetic`, a generalist,
v3's own), measured greedy on 200 fresh problems per task and saved as OUT/tiny-world-v3/student
beside a link to the built teacher, so that a sizing sweep can run on it with DISTILL_CACHE=OUT.
Usage: student_candidate.py OUT TEACHER_DIR MIXNAME [steps] [layers]   (LOG, 2026-12-03)"""

import json
import sys
import time
from pathlib import Path

import torch

from distill.models.evaluation import task_accuracy
from distill.models.tiny import char_tokenizer
from distill.models.tiny_world_recipes import _V3_STUDENT_MIX, ModelRecipe
from distill.models.tiny_world_train import train_model
from distill.tasks.registry import get_task

OUT, TEACHER, MIXNAME = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 3000
LAYERS = int(sys.argv[5]) if len(sys.argv) > 5 else 2
MIXES = {
    "drill": (
        ("countdown3", 0.12),
        ("countdown4", 0.04),
        ("countdown3_large", 0.04),
        ("countdown_chain", 0.04),
        ("arithmetic", 0.36),
        ("addition", 0.20),
        ("reversal", 0.20),
    ),
    # A generalist: Countdown in the teacher's proportions (68 % of rows), the priors the rest, and
    # few steps, so that every form the study measures is trained alike and none is an afterthought.
    "v3": _V3_STUDENT_MIX,  # v3's own, for a student of another shape
    "general": (
        ("countdown3", 0.30),
        ("countdown4", 0.19),
        ("countdown3_large", 0.08),
        ("countdown_chain", 0.11),
        ("addition", 0.16),
        ("reversal", 0.16),
    ),
}
MEASURED = (
    ("countdown3", 96),
    ("countdown4", 128),
    ("countdown3_large", 128),
    ("countdown_chain", 192),
    ("arithmetic", 24),
    ("addition", 16),
    ("reversal", 16),
)
torch.set_num_threads(2)
recipe = ModelRecipe(layers=LAYERS, hidden=128, heads=4, vocab_rows=112, steps=STEPS, lr=3e-3, mixture=MIXES[MIXNAME])
tok = char_tokenizer()
start = time.time()
model, seconds = train_model(recipe, tok, 0, f"student-{MIXNAME}", checkpoints=OUT / "ckpt", every=500)
world = OUT / "tiny-world-v3"
world.mkdir(parents=True, exist_ok=True)
model.save_pretrained(world / "student")
tok.save_pretrained(world / "student")
if not (world / "teacher").exists():
    (world / "teacher").symlink_to(TEACHER)
figures = {t: task_accuracy(model, tok, get_task(t), get_task(t).rows(200, 0), b) for t, b in MEASURED}
result = {"mix": MIXES[MIXNAME], "steps": STEPS, "layers": LAYERS, "train_seconds": seconds, "accuracy": figures}
(OUT / "student.json").write_text(json.dumps(result, indent=1))
print(json.dumps(result))
