"""Training and measuring a real model's task teacher: a LoRA adapter on the base model, trained on a
task's reference solutions through the model's chat template by a deterministic, resumable command.

    python -m distill.real_teacher train smollm2-countdown --work DIR    # hours on one core
    python -m distill.real_teacher evaluate smollm2-countdown --adapter DIR/adapter

`train` writes the adapter (`adapter_config.json`, `adapter_model.safetensors`: what
`distill/models/assets/real/NAME/` commits) and `recipe.json`; the training state is checkpointed
into DIR every few minutes, so a killed run resumes where it stopped when run again with the same
DIR, and ends with the weights of an uninterrupted one (no step draws random numbers: the problems
are a fixed seeded list, read in order). `evaluate` scores the base model and base + adapter greedily
on the task's test split, the problems every `distill fit` measures and the adapter never saw.
What the pair is, and why, is in `distill.models.real` (`ADAPTERS`) and docs/real-models.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from distill.models import real
from distill.seeds import path_seed
from distill.tasks import countdown
from distill.tasks.registry import get_task

# Problems the adapter must never see: the evaluation splits' first rows, as the data module draws
# them (`path_seed("val")`, `path_seed("test")`: a split's rows are a prefix of a longer draw).
HELD_OUT_ROWS = 2000


def training_rows(adapter: real.TeacherAdapter) -> list[dict]:
    """The adapter's training rows in reading order: `steps * batch_size` seeded problems of its
    task, none of them among the evaluation splits' first `HELD_OUT_ROWS`, each with its reference
    solution (`countdown.solution`, plain style) as `completion`."""
    task = get_task(adapter.task)
    held_out = {
        (tuple(r["numbers"]), r["target"])
        for part in ("val", "test")
        for r in task.rows(HELD_OUT_ROWS, seed=path_seed(part))
    }
    need = adapter.steps * adapter.batch_size
    rows: list[dict] = []
    draw = 0
    while len(rows) < need:
        for r in task.rows(need, seed=path_seed("real-teacher", adapter.task, adapter.seed, draw)):
            if (tuple(r["numbers"]), r["target"]) not in held_out and len(rows) < need:
                rows.append({**r, "completion": countdown.solution(r["numbers"], r["target"])})
        draw += 1
    return rows


class ChatCollator:
    """(rows) -> right-padded chat examples: the prompt exactly as distill renders a student's
    (`PromptCollator.render`, tokenized without added special tokens), then the reference solution
    and EOS (`<|im_end|>`, where the template ends a reply); loss on the reply's tokens only."""

    def __init__(self, tokenizer):
        from distill.data.prompts import PromptCollator

        self.tok = tokenizer
        self.prompts = PromptCollator(tokenizer, chat_template=True)

    def encode(self, row: dict) -> tuple[list[int], list[int]]:
        prompt = self.tok(self.prompts.render(row["messages"]), add_special_tokens=False)["input_ids"]
        reply = self.tok(row["completion"], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return prompt, reply

    def __call__(self, rows: list[dict]) -> dict:
        pairs = [self.encode(r) for r in rows]
        width = max(len(p) + len(c) for p, c in pairs)
        ids, mask, labels = [], [], []
        for p, c in pairs:
            pad = width - len(p) - len(c)
            ids.append(p + c + [self.tok.pad_token_id] * pad)
            mask.append([1] * (len(p) + len(c)) + [0] * pad)
            labels.append([-100] * len(p) + c + [-100] * pad)
        return {
            "input_ids": torch.tensor(ids),
            "attention_mask": torch.tensor(mask),
            "labels": torch.tensor(labels),
        }


def lora_model(base_folder: str, adapter: real.TeacherAdapter):
    """The base model (float32) wrapped with a fresh LoRA adapter of `adapter`'s shape, seeded."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(adapter.seed)
    base = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
    config = LoraConfig(
        r=adapter.rank,
        lora_alpha=adapter.alpha,
        lora_dropout=0.0,  # no random draws in a step: a resumed run equals an uninterrupted one
        target_modules=list(adapter.targets),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(base, config)


def train(name: str, work: Path, checkpoint_minutes: float = 5.0) -> Path:
    """Train adapter `name` into `work/adapter` (resuming from `work/last.ckpt` when there is one);
    returns the adapter folder."""
    import datetime

    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    from distill.models.loading import load_tokenizer
    from distill.models.tiny_world_train import BuildProgress, LMTrainer, Log
    from distill.run_record import AtomicCheckpointIO

    adapter = real.adapter(name)
    base = real.resolve(real.PREFIX + adapter.base)
    work.mkdir(parents=True, exist_ok=True)
    say = Log(work / "train.log")
    L.seed_everything(adapter.seed, verbose=False)
    tokenizer = load_tokenizer(base)
    model = lora_model(base, adapter)
    rows = training_rows(adapter)
    last = work / "last.ckpt"
    step = 0
    if last.is_file():
        step = int(torch.load(last, map_location="cpu", weights_only=False)["global_step"])
    loader = DataLoader(
        rows[step * adapter.batch_size :], batch_size=adapter.batch_size, collate_fn=ChatCollator(tokenizer)
    )
    progress = BuildProgress(name, adapter.steps, say)
    saver = ModelCheckpoint(
        dirpath=work,
        save_top_k=0,
        save_last=True,
        train_time_interval=datetime.timedelta(minutes=checkpoint_minutes),
    )
    trainer = L.Trainer(
        max_steps=adapter.steps,
        accelerator="cpu",
        devices=1,
        precision="bf16-mixed",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=1.0,
        deterministic=True,
        callbacks=[progress, saver],
        plugins=[AtomicCheckpointIO()],
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    say(
        f"training {name}: LoRA r={adapter.rank} on {list(adapter.targets)} of {real.PREFIX}{adapter.base} "
        f"({trainable:,} parameters), {adapter.steps} steps of {adapter.batch_size} {adapter.task} "
        f"solutions, lr {adapter.lr}" + (f", resuming at step {step}" if step else "")
    )
    trainer.fit(LMTrainer(model, adapter.lr, adapter.steps), loader, ckpt_path=last if step else None)
    out = work / "adapter"
    save_adapter(model, out, name)
    (out / "recipe.json").write_text(json.dumps(real.adapter_record(name), indent=1) + "\n")
    say(f"{name}: adapter written to {out} after {progress.seconds / 60:.1f} min of training")
    return out


def save_adapter(model, out: Path, name: str) -> None:
    """The adapter's weights in bfloat16 (half the bytes to commit; the merged teacher is made from,
    and measured as, these rounded values)."""
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(torch.bfloat16)
    for config in model.peft_config.values():  # the base by its name, not this machine's cache path
        config.base_model_name_or_path = real.PREFIX + real.adapter(name).base
    model.save_pretrained(out)


def greedy_accuracy(model, tokenizer, task_name: str, rows: list[dict], max_new_tokens: int, batch: int = 16):
    """Greedy accuracy on `rows` through the chat template (the student's prompt as a fit renders
    it, `PromptCollator.render`), and the completions."""
    from distill.data.prompts import PromptCollator
    from distill.models.evaluation import greedy_completions

    task = get_task(task_name)
    prompts = PromptCollator(tokenizer, chat_template=True)
    rendered = [prompts.render(r["messages"]) for r in rows]
    texts = greedy_completions(model, tokenizer, rendered, max_new_tokens, batch, add_special_tokens=False)
    scores = [task.score(t, r) for t, r in zip(texts, rows)]
    return sum(scores) / len(rows), texts


def evaluate(name: str, adapter_dir: Path | None, problems: int, max_new_tokens: int) -> dict:
    """Greedy test-split accuracy of the base model and of base + adapter (`adapter_dir`, default
    the committed one, merged as `real:NAME` is)."""
    from transformers import AutoModelForCausalLM

    from distill.models.loading import load_tokenizer

    adapter = real.adapter(name)
    rows = get_task(adapter.task).rows(problems, seed=path_seed("test"))
    base_folder = real.resolve(real.PREFIX + adapter.base)
    tokenizer = load_tokenizer(base_folder)
    result = {"task": adapter.task, "problems": problems, "max_new_tokens": max_new_tokens}
    for who in ("student", "teacher"):
        start = time.time()
        if who == "student":
            model = AutoModelForCausalLM.from_pretrained(base_folder, dtype=torch.float32)
        else:
            model = real.merged_model(base_folder, adapter_dir or real.adapter_folder(name))
        accuracy, texts = greedy_accuracy(model, tokenizer, adapter.task, rows, max_new_tokens)
        result[who] = {"accuracy": accuracy, "seconds": round(time.time() - start, 1), "example": texts[0]}
        print(f"{who}: {accuracy:.1%} of {problems} ({result[who]['seconds']} s)", flush=True)
    return result


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m distill.real_teacher", description=__doc__.split("\n")[0]
    )
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train an adapter (resumable)")
    t.add_argument("name", choices=sorted(real.ADAPTERS))
    t.add_argument("--work", type=Path, required=True, help="checkpoints, log and the adapter go here")
    t.add_argument(
        "--threads", type=int, default=1, help="torch threads (one is fastest on a busy 2-core machine)"
    )
    e = sub.add_parser("evaluate", help="greedy test accuracy of the base model and the teacher")
    e.add_argument("name", choices=sorted(real.ADAPTERS))
    e.add_argument(
        "--adapter", type=Path, default=None, help="an adapter folder (default: the committed one)"
    )
    e.add_argument("--problems", type=int, default=100)
    e.add_argument("--max-new-tokens", type=int, default=64)
    e.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    e.add_argument("--threads", type=int, default=1)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.command == "train":
        train(args.name, args.work)
    else:
        result = evaluate(args.name, args.adapter, args.problems, args.max_new_tokens)
        if args.out is not None:
            args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
