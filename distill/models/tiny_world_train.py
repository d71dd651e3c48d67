"""Training one tiny-world model: the seeded corpus stream, the collator and the Lightning loop."""

from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import itertools
import json
import random
import time
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, IterableDataset
from transformers import LlamaForCausalLM

from distill.models.tiny import llama_config
from distill.models.tiny_world_recipes import ModelRecipe
from distill.tasks import arithmetic, countdown, countdown_chain, prior, tinysci

# --- data ----------------------------------------------------------------------------------------

KNOWLEDGE_STREAMS = ("tinysci", "tinysci_student")  # every fact / the student's facts only


def _chunk(task: str, n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (prompt, completion-without-style) examples of `task`, deterministic in `seed`; Countdown
    rows keep their problem so that the style is applied by the caller. `tinysci` is the knowledge
    domain's training pool, `tinysci_student` its questions about the student's facts only."""
    if task in prior.TASKS:
        return [(prior.prompt(e.task, e.query), e.completion) for e in prior.generate(task, n, seed=seed)]
    if task in KNOWLEDGE_STREAMS:
        known = tinysci.student_facts() if task == "tinysci_student" else None
        return tinysci.corpus(n, seed, known)
    if task == countdown_chain.NAME:
        return countdown_chain.generate(n, seed)
    if task == arithmetic.NAME:
        return [(arithmetic.prompt(s), s.completion) for s in arithmetic.generate(n, seed)]
    return countdown.generate(n, seed=seed, difficulty_name=task)


def _example(task: str, item, style: str) -> tuple[str, str]:
    if task in prior.TASKS or task in KNOWLEDGE_STREAMS or task == arithmetic.NAME:  # (prompt, completion)
        return item
    if task == countdown_chain.NAME:
        return countdown_chain.prompt(item), countdown_chain.solution(item, style=style)
    return countdown.prompt(*item), countdown.solution(*item, style=style)


CHUNK = 256  # rows per chunk of a mixture stream: each task's pool, and each chunk's style draws


def _chunk_seed(seed: int, chunk: int) -> int:
    # Training seeds start at 10**6, so they never coincide with evaluation seeds.
    return 10**6 + seed * 10**4 + chunk


class MixtureStream(IterableDataset):
    """An endless, seeded stream of (prompt, completion) rows, each drawn from the mixture: per
    chunk of `CHUNK` rows, row i of the drawn task's chunk (v1's stream, unchanged). `start` rows are skipped
    (a resumed build): whole chunks only advance the task draws, nothing is generated for them."""

    def __init__(self, recipe: ModelRecipe, seed: int, start: int = 0):
        self.recipe, self.seed, self.start = recipe, seed, start

    def __iter__(self):
        r = self.recipe
        rng = random.Random(f"tiny-world/{self.seed}")
        tasks = [t for t, _ in r.mixture]
        weights = [w for _, w in r.mixture]
        chunk, skip = divmod(self.start, CHUNK)
        for _ in range(chunk * CHUNK):
            rng.choices(range(len(tasks)), weights)
        while True:
            pools = [_chunk(t, CHUNK, _chunk_seed(self.seed, chunk)) for t in tasks]
            styles = _row_styles(r, self.seed, chunk)
            chunk += 1
            for i in range(CHUNK):
                k = rng.choices(range(len(tasks)), weights)[0]
                if i >= skip:
                    yield _example(tasks[k], pools[k][i], styles[i])
            skip = 0


def _row_styles(recipe: ModelRecipe, seed: int, chunk: int) -> list[str]:
    """Each row's style in a chunk: `recipe.style`, or at `style_rate` < 1 that style for a seeded
    share of the rows and plain for the rest (drawn from a stream of their own, so the task draws,
    and every stream at rate 1, are unchanged)."""
    if recipe.style_rate >= 1:
        return [recipe.style] * CHUNK
    draws = random.Random(f"tiny-world-style/{seed}/{chunk}")
    return [recipe.style if draws.random() < recipe.style_rate else "plain" for _ in range(CHUNK)]


@functools.lru_cache(maxsize=32)
def corpus_digest(recipe: ModelRecipe, seed: int, rows: int = 512) -> str:
    """A fingerprint of what a model reads: the hash of its stream's first `rows` rows. A stamp
    carries it, so that a change to a task's generator (not only to the recipe) retrains."""
    head = list(itertools.islice(iter(MixtureStream(recipe, seed)), rows))
    return hashlib.sha256(json.dumps(head).encode()).hexdigest()[:16]


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


def _loader(recipe: ModelRecipe, tokenizer, seed: int, step: int = 0) -> DataLoader:
    """The model's stream from optimiser step `step` on (one batch per step)."""
    stream = MixtureStream(recipe, seed, start=step * recipe.batch_size)
    return DataLoader(stream, batch_size=recipe.batch_size, collate_fn=Collator(tokenizer))


# --- training ------------------------------------------------------------------------------------


class Log:
    """Build messages to the terminal and to `build.log`: one line each, readable in a file."""

    def __init__(self, path: Path | None = None):
        self.path = path  # appended to: every build into a folder leaves its lines
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, message: str) -> None:
        line = f"[tiny-world {time.strftime('%H:%M:%S')}] {message}"
        print(line, flush=True)
        if self.path is not None:
            with self.path.open("a") as f:
                f.write(line + "\n")


def duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s"


class BuildProgress(L.Callback):
    """Every 5 % of a model's steps: step of total, mean loss since the last line, elapsed, ETA."""

    def __init__(self, name: str, total: int, log: Log, lines: int = 20):
        self.name, self.total, self.say = name, total, log
        self.every = max(1, -(-total // lines))
        self.losses: list[float] = []
        self.start = 0.0
        self.before = 0.0  # training seconds of earlier runs, from a resumed checkpoint

    @property
    def seconds(self) -> float:
        """Training seconds of this model so far, resumed runs included."""
        return self.before + time.time() - self.start

    def state_dict(self) -> dict:
        return {"seconds": self.seconds}

    def load_state_dict(self, state_dict: dict) -> None:
        self.before = float(state_dict["seconds"])

    def on_train_start(self, trainer, pl_module):
        self.start, self.first = time.time(), trainer.global_step  # a resumed model starts later

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        step = trainer.global_step
        if step % self.every and step != self.total:
            return
        elapsed = time.time() - self.start
        eta = elapsed / max(1, step - self.first) * (self.total - step)
        loss = sum(self.losses) / len(self.losses)
        self.losses.clear()
        self.say(
            f"{self.name}: step {step}/{self.total}  loss {loss:.4f}  "
            f"elapsed {duration(elapsed)}  ETA {duration(eta)}"
        )


class LMTrainer(L.LightningModule):
    """Supervised next-token training of one causal LM, warmup then cosine decay."""

    def __init__(self, model, lr: float, steps: int):
        super().__init__()
        self.model, self.lr, self.steps = model, lr, steps

    def training_step(self, batch, _):
        return self.model(**batch).loss

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


def new_model(recipe: ModelRecipe, tokenizer) -> LlamaForCausalLM:
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
    return LlamaForCausalLM(config)


CHECKPOINT_EVERY = datetime.timedelta(minutes=5)


def train_model(
    recipe: ModelRecipe,
    tokenizer,
    seed: int,
    name: str,
    log: Log = print,
    init: LlamaForCausalLM | None = None,
    checkpoints: Path | None = None,
    every: datetime.timedelta | int = CHECKPOINT_EVERY,
) -> tuple[LlamaForCausalLM, float]:
    """Train one model of the world (from scratch, or from a copy of `init`); return it in eval
    mode and its training seconds (a resumed model's earlier runs included).

    With `checkpoints` (a folder), the training state (weights, optimiser, schedule, step) is saved
    there as `last.ckpt` every `every` (a wall-time interval, or an int: optimiser steps), written
    atomically; a call that finds one resumes from it, reading the stream from that step on, and
    ends with the weights of an uninterrupted run (no step draws random numbers). The caller
    decides whether a checkpoint belongs to this recipe (`tiny_world.build` keeps a stamp beside it)."""
    L.seed_everything(seed, verbose=False)
    if init is None:
        model = new_model(recipe, tokenizer)
    else:
        c = init.config
        shape = (
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            init.get_output_embeddings().weight.shape[0],
        )
        if shape != (recipe.layers, recipe.hidden, recipe.heads, recipe.vocab_rows):
            raise ValueError(
                f"{name}: recipe shape (layers, hidden, heads, vocab_rows) = "
                f"{(recipe.layers, recipe.hidden, recipe.heads, recipe.vocab_rows)} differs from "
                f"{recipe.init_from!r}'s {shape}"
            )
        model = copy.deepcopy(init).train()
    progress = BuildProgress(name, recipe.steps, log)
    callbacks: list = [progress]
    plugins, last, step = [], None, 0
    if checkpoints is not None:
        from distill.run_record import AtomicCheckpointIO  # a killed build never leaves half a file

        plugins.append(AtomicCheckpointIO())
        interval = (
            {"every_n_train_steps": every} if isinstance(every, int) else {"train_time_interval": every}
        )
        callbacks.append(ModelCheckpoint(dirpath=checkpoints, save_top_k=0, save_last=True, **interval))
        if (checkpoints / "last.ckpt").is_file():
            last = checkpoints / "last.ckpt"
            step = int(torch.load(last, map_location="cpu", weights_only=False)["global_step"])
    trainer = L.Trainer(
        max_steps=recipe.steps,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=checkpoints is not None,
        enable_progress_bar=False,
        gradient_clip_val=1.0,
        enable_model_summary=False,
        deterministic=True,
        callbacks=callbacks,
        plugins=plugins,
    )
    start = f"from {recipe.init_from}" if init is not None else "from scratch"
    resume = f", resuming at step {step}" if last is not None else ""
    log(
        f"training {name} ({start}): {recipe.layers}x{recipe.hidden}, {recipe.steps} steps, "
        f"batch {recipe.batch_size}{resume}"
    )
    trainer.fit(
        LMTrainer(model, recipe.lr, recipe.steps), _loader(recipe, tokenizer, seed, step), ckpt_path=last
    )
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model.eval(), round(progress.seconds, 1)
