"""`distill tiny-world`: build the CPU model organism — a teacher good at Countdown-3 that reasons in
its own style, and a weaker student with prior abilities that distillation can erase.

    distill tiny-world                 # full build into $DISTILL_CACHE/tiny-world (about 20 min, 2 cores)
    distill tiny-world --quick --out /tmp/tw   # low-quality world in under a minute (tests)

Both models are Llama-style, trained with Lightning from a fixed seed, saved with `save_pretrained`
beside the char tokenizer, and loadable offline with the `Auto*` classes. Their embeddings are
padded past the tokenizer (128 and 112 rows for 104 tokens), as real checkpoints' are.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset
from transformers import LlamaForCausalLM

from distill.models.evaluation import countdown_eval, prior_accuracy
from distill.models.tiny import char_tokenizer, llama_config
from distill.runinfo import write_json_atomic
from distill.tasks import countdown, prior

# The committed full build (package data), installed by `distill tiny-world` without retraining.
ASSETS = Path(__file__).parent / "assets" / "tiny-world"


@dataclass(frozen=True)
class ModelRecipe:
    layers: int
    hidden: int
    heads: int
    vocab_rows: int
    steps: int
    lr: float
    batch_size: int = 64
    # Sampling weights of the training mixture: countdown (in `style`), addition, reversal.
    countdown_weight: float = 1.0
    addition_weight: float = 0.0
    reversal_weight: float = 0.0
    style: str = "plain"


@dataclass(frozen=True)
class Recipe:
    teacher: ModelRecipe
    student: ModelRecipe
    eval_problems: int = 500
    seed: int = 0
    threads: int = 2  # fixed, so that the float reduction order (and the weights) are reproducible


# Sized by measurement on 2 CPU cores (experiments/LOG.md): on CPU, training time, not parameter
# count, limits these models, so the teacher is only somewhat larger than the student.
FULL = Recipe(
    teacher=ModelRecipe(
        layers=3, hidden=192, heads=4, vocab_rows=128, steps=3000, lr=2e-3, batch_size=32, style="teacher"
    ),
    student=ModelRecipe(
        layers=2,
        hidden=128,
        heads=4,
        vocab_rows=112,
        steps=2500,
        lr=3e-3,
        countdown_weight=0.05,
        addition_weight=0.5,
        reversal_weight=0.45,
    ),
)
QUICK = Recipe(
    teacher=ModelRecipe(
        layers=2, hidden=64, heads=2, vocab_rows=128, steps=30, lr=3e-3, batch_size=32, style="teacher"
    ),
    student=ModelRecipe(
        layers=1,
        hidden=32,
        heads=2,
        vocab_rows=112,
        steps=30,
        lr=3e-3,
        batch_size=32,
        countdown_weight=0.2,
        addition_weight=0.4,
        reversal_weight=0.4,
    ),
    eval_problems=50,
)


def default_dir() -> Path:
    return Path(os.environ.get("DISTILL_CACHE", Path.home() / ".cache" / "distill")) / "tiny-world"


class MixtureStream(IterableDataset):
    """An endless, seeded stream of (prompt, completion) pairs from the recipe's task mixture."""

    def __init__(self, recipe: ModelRecipe, seed: int):
        self.recipe, self.seed = recipe, seed

    def __iter__(self):
        r = self.recipe
        rng = random.Random(f"tiny-world/{self.seed}")
        weights = (r.countdown_weight, r.addition_weight, r.reversal_weight)
        chunk = 0
        while True:
            # Training seeds start at 10**6 so they never coincide with evaluation seeds.
            problems = countdown.generate(256, seed=10**6 + self.seed * 10**4 + chunk)
            adds = prior.generate("addition", 256, seed=10**6 + self.seed * 10**4 + chunk)
            revs = prior.generate("reversal", 256, seed=10**6 + self.seed * 10**4 + chunk)
            chunk += 1
            for p, a, v in zip(problems, adds, revs):
                kind = rng.choices(range(3), weights)[0]
                if kind == 0:
                    yield countdown.prompt(*p), countdown.solution(*p, style=r.style)
                elif kind == 1:
                    yield prior.prompt(a.task, a.query), a.completion
                else:
                    yield prior.prompt(v.task, v.query), v.completion


class Collator:
    """Tokenise prompt + completion + EOS, right-padded; loss only on completion tokens."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def __call__(self, pairs):
        rows, labels = [], []
        for prompt_text, completion in pairs:
            p = self.tok(prompt_text)["input_ids"]
            c = self.tok(completion, add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
            rows.append(p + c)
            labels.append([-100] * len(p) + c)
        width = max(map(len, rows))
        pad = self.tok.pad_token_id
        return {
            "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
            "labels": torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels]),
        }


class LMTrainer(L.LightningModule):
    """Supervised next-token training of one causal LM, warmup then cosine decay."""

    def __init__(self, model, lr: float, steps: int):
        super().__init__()
        self.model, self.lr, self.steps = model, lr, steps

    def training_step(self, batch, _):
        loss = self.model(**batch).loss
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.01, betas=(0.9, 0.98))
        warmup = max(1, self.steps // 20)

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            progress = (step - warmup) / max(1, self.steps - warmup)
            return 0.05 + 0.95 * 0.5 * (1 + torch.cos(torch.tensor(torch.pi * progress)).item())

        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def train_model(recipe: ModelRecipe, tokenizer, seed: int, name: str) -> LlamaForCausalLM:
    L.seed_everything(seed, verbose=False)
    config = llama_config(
        vocab_size=recipe.vocab_rows,
        hidden_size=recipe.hidden,
        num_layers=recipe.layers,
        num_heads=recipe.heads,
        intermediate_size=2 * recipe.hidden,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    loader = DataLoader(
        MixtureStream(recipe, seed), batch_size=recipe.batch_size, collate_fn=Collator(tokenizer)
    )
    trainer = L.Trainer(
        max_steps=recipe.steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        gradient_clip_val=1.0,
        enable_model_summary=False,
        deterministic=True,
    )
    print(f"[tiny-world] training {name}: {recipe.layers}x{recipe.hidden}, {recipe.steps} steps", flush=True)
    trainer.fit(LMTrainer(model, recipe.lr, recipe.steps), loader)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval()


def _is_built(out: Path, recipe: Recipe) -> bool:
    try:
        quality = json.loads((out / "quality.json").read_text())
    except (OSError, ValueError):
        return False
    return quality.get("recipe") == asdict(recipe) and all(
        (out / m / "config.json").exists() for m in ("teacher", "student")
    )


def build(out: Path, recipe: Recipe = FULL, force: bool = False) -> dict:
    """Build (or reuse) a tiny world in `out`; returns the quality figures.

    Without `force`, a world already in `out` with the same recipe is reused, and the full recipe
    is installed from the committed build (`ASSETS`, byte-identical to what training produces here,
    see `verify`) instead of retrained."""
    out = Path(out)
    if not force and _is_built(out, recipe):
        print(f"[tiny-world] reusing {out} (built with the same recipe)")
        return json.loads((out / "quality.json").read_text())
    if not force and _is_built(ASSETS, recipe):
        print(f"[tiny-world] installing the committed build into {out} (`--force` retrains it)")
        for name in ("teacher", "student"):
            _replace_dir(out / name, lambda tmp, name=name: shutil.copytree(ASSETS / name, tmp))
        shutil.copyfile(ASSETS / "quality.json", out / "quality.json")
        return json.loads((out / "quality.json").read_text())
    torch.set_num_threads(recipe.threads)
    start = time.time()
    tokenizer = char_tokenizer()
    quality: dict = {}
    (out / "quality.json").unlink(missing_ok=True)  # the world is unfinished until it is rewritten
    for name in ("teacher", "student"):
        t0 = time.time()
        model = train_model(getattr(recipe, name), tokenizer, recipe.seed, name)
        quality[f"{name}_train_seconds"] = round(time.time() - t0, 1)
        _replace_dir(
            out / name, lambda tmp, model=model: (model.save_pretrained(tmp), tokenizer.save_pretrained(tmp))
        )
        problems = countdown.generate(recipe.eval_problems, seed=0)
        scores = countdown_eval(model, tokenizer, problems)
        quality[f"{name}_countdown3"] = scores["accuracy"]
        quality[f"{name}_style_share"] = scores["style_share"]
        if name == "student":
            per_task = {
                t: prior_accuracy(model, tokenizer, prior.generate(t, recipe.eval_problems, seed=0))
                for t in prior.TASKS
            }
            quality.update({f"student_prior_{t}": v for t, v in per_task.items()})
            quality["student_prior"] = min(per_task.values())
    quality["build_seconds"] = round(time.time() - start, 1)
    quality["threads"] = torch.get_num_threads()
    quality["recipe"] = asdict(recipe)
    write_json_atomic(out / "quality.json", quality)
    return quality


def _replace_dir(target: Path, fill) -> None:
    """Fill a temporary folder, then swap it in: an interrupted build never leaves a half model."""
    tmp = target.parent / f".{target.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    fill(tmp)
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def verify(recipe: Recipe = FULL, committed: Path | None = None) -> bool:
    """Retrain `recipe` from scratch and check that every weight equals the committed build's."""
    committed = Path(committed or ASSETS)
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp), recipe, force=True)
        same = True
        for name in ("teacher", "student"):
            ours = load_file(Path(tmp) / name / "model.safetensors")
            theirs = load_file(committed / name / "model.safetensors")
            equal = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
            print(f"[tiny-world] {name}: {'identical to' if equal else 'DIFFERS from'} the committed build")
            same &= equal
    return same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="distill tiny-world", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default: $DISTILL_CACHE/tiny-world)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="a low-quality world in under a minute (for tests)"
    )
    parser.add_argument(
        "--force", action="store_true", help="retrain even if a world with this recipe exists"
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="retrain the full recipe in a temporary folder and compare every tensor with the committed build",
    )
    args = parser.parse_args(argv)
    if args.verify:
        return 0 if verify() else 1
    out = args.out or default_dir()
    quality = build(out, QUICK if args.quick else FULL, force=args.force)
    shown = {k: v for k, v in quality.items() if k != "recipe"}
    print(f"[tiny-world] {out}\n" + "\n".join(f"  {k:24s} {v}" for k, v in shown.items()))
    return 0
