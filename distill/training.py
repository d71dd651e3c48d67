"""What both LightningModules (distillation, GRPO) share about an optimiser step.

`StepLoop` is the one implementation of the mechanics both trainers run: a rollout batch split
into micro-batches whose backward passes accumulate (DDP all-reduces once, at the last), then one
optimiser step: clip, skip a non-finite step (`NonFiniteGuard`), step the optimiser and the LR
schedule, zero the gradients. Each trainer hands it the loss of one micro-batch; what the loss is
(a divergence, GRPO's surrogate) stays in the trainer.

`Execution` and `TextLog` are the settings both trainers take as groups (`model.execution.*`,
`model.text_log.*`): how the models run, and which rollout texts go to TensorBoard.

`StepResult` is what a training step hands every measurement callback: the module returns
`StepResult(...).output()` and a callback reads it back with `step_result(outputs)` in
`on_train_batch_end`; its `StepCost` says what the batch cost beyond its rollout.

`EvalFigures` accumulates the validation and test figures over the whole epoch, every rank included.

`NonFiniteGuard` skips an optimiser step whose loss or gradient norm is not finite; after
`patience` such steps in a row it stops the run (`distill.errors.Diverged`). A skipped step
leaves the weights, the optimiser state and the LR schedule untouched (its gradients are
dropped), so the last checkpoint before the divergence and the weights at the stop are the same
good weights. Under DDP the decision is taken on every rank together."""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from torch import Tensor
from torchmetrics import Metric

from distill.checks import check_int, check_number
from distill.errors import Diverged
from distill.losses import token_statistics
from distill.losses.functional import STATISTICS
from distill.models.forward import causal_logits, completion_width, row_chunks
from distill.models.loading import check_attn_implementation
from distill.parallel import full_tensor, gathered, gradient_sync
from distill.rollout import RolloutBatch
from distill.tasks import qa
from distill.tasks.registry import get_task


@dataclass(frozen=True)
class Execution:
    """How a trainer's models run: each setting trades speed for memory or the reverse; the
    figures stay the same to float rounding.

    Args:
        lean_logits: the LM heads run only on the completion columns (the last K positions of the
            rollout batch, `distill.models.forward.completion_width`), in training and evaluation;
            False computes logits for every position (same numbers, more memory; kept for
            `benchmarks/memory.py`).
        eval_logit_budget_mb: evaluation scores rollouts in row chunks whose logits (both models
            together, at their dtypes) stay within this many MiB (> 0).
        gradient_checkpointing: recompute the student's layer activations in backward instead of
            keeping them (HF activation checkpointing, non-reentrant): less memory for about one
            more forward pass; the same gradient.
        attn_implementation: attention kernel of every model, passed to `from_pretrained` (`eager`,
            `sdpa`, `flash_attention_2`, ...: the names transformers knows); None = its default.
        compile_decoding: sample rollouts (training and measurement alike) with a static KV cache
            and a `torch.compile`d decode step (`distill.rollout.compiled`): the same sampling,
            faster decoding after a compile of tens of seconds per model; a model that fails to
            compile, and a student sharded with FSDP2, decode eagerly with a warning.
        compile_forwards: run the full-sequence passes (the step's forward + backward, the frozen
            model's forward, evaluation scoring) through `torch.compile` with dynamic shapes
            (`distill.models.compiled`): faster on CPU after a compile of tens of seconds per model
            and mode; a model that fails to compile, and a sharded student, run eagerly.
    """

    lean_logits: bool = True
    eval_logit_budget_mb: float = 512.0
    gradient_checkpointing: bool = False
    attn_implementation: str | None = None
    compile_decoding: bool = False
    compile_forwards: bool = False

    def __post_init__(self) -> None:
        check_number("model.execution.eval_logit_budget_mb", self.eval_logit_budget_mb, 0, open_min=True)
        check_attn_implementation(self.attn_implementation, "model.execution.attn_implementation")


@dataclass(frozen=True)
class TextLog:
    """A few rollouts logged as text to TensorBoard, with their scores.

    Args:
        every: log every N optimiser steps (GRPO: rollout batches); 0 = never.
        samples: rollouts per log.
    """

    every: int = 50
    samples: int = 2

    def __post_init__(self) -> None:
        check_int("model.text_log.every", self.every, 0)
        check_int("model.text_log.samples", self.samples, 1)


@dataclass
class StepCost:
    """Work of one training batch beyond its rollout (whose own counters are in `RolloutBatch`):
    real tokens each model read and wall seconds per phase."""

    student_train_tokens: int = 0  # the student's forward + backward, once per optimiser pass
    teacher_forward_tokens: int = 0  # the frozen teacher's forward (distillation)
    reference_forward_tokens: int = 0  # the frozen reference's forward (GRPO)
    student_forward_backward_s: float = 0.0  # the optimiser step included
    teacher_forward_s: float = 0.0
    reference_forward_s: float = 0.0


@dataclass
class StepResult:
    """One training batch, as measurement callbacks see it."""

    loss: torch.Tensor  # the mean loss over the batch's optimiser passes
    rollout: RolloutBatch
    num_items: int  # completion tokens the loss is normalised by
    grad_norm: float  # the student's gradient norm before clipping (the last pass's)
    cost: StepCost = field(default_factory=StepCost)
    reused_rollout: bool = False  # the rollout was sampled for an earlier step (refresh_every)

    def output(self) -> dict:
        """What `training_step` returns: Lightning's manual optimisation takes a dict and hands it
        to `on_train_batch_end` as `outputs`; the result travels under `step`."""
        return {"loss": self.loss, "step": self}


class LogitGradSink(Protocol):
    """What a module's `logit_grad_sink` is (set by `GradientStats`): it receives the loss gradient
    w.r.t. the student's logits `[b, T-1, V]` of each micro-batch, with the rollout's masks."""

    def record(
        self, grad: Tensor, completion_mask: Tensor, teacher_token_mask: Tensor, num_items
    ) -> None: ...


def log_texts(module, tag: str, texts: list[str], header: str = "") -> None:
    """Sample texts to TensorBoard (indented, so they render as code blocks), if it is the logger."""
    logger = module.logger
    if isinstance(logger, TensorBoardLogger) and texts:
        body = "\n\n".join(f"    {t}".replace("\n", "\n    ") for t in texts)
        logger.experiment.add_text(tag, header + body, module.global_step)


def step_result(outputs) -> StepResult | None:
    """The `StepResult` in a training step's `outputs`, or None (another module's step)."""
    step = outputs.get("step") if isinstance(outputs, dict) else None
    return step if isinstance(step, StepResult) else None


def student_optimizers(student, optimizer_factory, scheduler_factory=None):
    """`configure_optimizers`' answer: the optimiser over the student's trainable parameters only
    (never a frozen teacher's or reference's) and, with a schedule, stepped once per optimiser step."""
    optimizer = optimizer_factory([p for p in student.parameters() if p.requires_grad])
    if scheduler_factory is None:
        return optimizer
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler_factory(optimizer), "interval": "step"},
    }


def resolve_callable(value, field: str):
    """`value`, or the object its import path names: jsonargparse hands a function default of an
    `OptimizerCallable` argument (the modules' `_default_optimizer`) on as that path, unresolved, when
    a config names no optimizer."""
    if not isinstance(value, str):
        return value
    module, _, name = value.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError):
        found = None
    if not callable(found):
        raise ValueError(f"{field}: {value!r} names no callable")
    return found


def check_optimizer(optimizer, lr_scheduler=None, owner: str = "model") -> None:
    """Build the optimiser (and schedule) once over a dummy parameter, so that an invalid setting
    (a negative learning rate, betas outside [0, 1), ...) fails before any model is loaded."""
    probe = torch.nn.Parameter(torch.zeros(1))
    try:
        built = optimizer([probe])
    except (ValueError, TypeError) as err:
        raise ValueError(f"{owner}.optimizer: {err}") from None
    if lr_scheduler is not None:
        try:
            lr_scheduler(built)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{owner}.lr_scheduler: {err}") from None


class NonFiniteGuard:
    def __init__(self, patience: int, owner: str = "model.max_nonfinite_steps"):
        check_int(owner, patience, 1)
        self.patience = patience
        self.skipped = 0  # non-finite steps in the whole run
        self.in_a_row = 0

    def step_ok(self, loss: torch.Tensor | float, grad_norm: torch.Tensor | float, trainer=None) -> bool:
        """Whether the step may update the weights; counts it when not, and raises `Diverged` at
        `patience` bad steps in a row."""
        bad = not (math.isfinite(float(loss)) and math.isfinite(float(grad_norm)))
        if trainer is not None:  # every rank skips together (a NaN on one rank reaches all via DDP)
            bad = bool(trainer.strategy.reduce_boolean_decision(bad, all=False))
        if not bad:
            self.in_a_row = 0
            return True
        self.skipped += 1
        self.in_a_row += 1
        if self.in_a_row >= self.patience:
            step = f" after optimiser step {trainer.global_step}" if trainer is not None else ""
            raise Diverged(
                f"{self.in_a_row} steps in a row had a non-finite loss or gradient norm{step} "
                f"(last: loss {float(loss)}, gradient norm {float(grad_norm)}); lower the learning "
                "rate or raise the divergence temperature"
            )
        return False

    def state_dict(self) -> dict:
        return {"skipped": self.skipped, "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.skipped, self.in_a_row = int(state["skipped"]), int(state["in_a_row"])


class StepLoop:
    """Micro-batches, gradient accumulation and the optimiser step, as both trainers run them.

    Args:
        micro_batch_size: sequences per forward/backward pass (>= 1); None = the whole batch.
        gradient_clip_val: clip the student's gradient norm to this value (> 0; None = no clipping).
        max_nonfinite_steps: patience of the `NonFiniteGuard` (>= 1).
        owner: the config group the settings belong to, named in their errors.
    """

    def __init__(
        self,
        micro_batch_size: int | None,
        gradient_clip_val: float | None,
        max_nonfinite_steps: int,
        owner: str = "model",
    ):
        check_int(f"{owner}.micro_batch_size", micro_batch_size, 1, optional=True)
        check_number(f"{owner}.gradient_clip_val", gradient_clip_val, 0, open_min=True, optional=True)
        self.micro_batch_size = micro_batch_size
        self.gradient_clip_val = gradient_clip_val
        self.guard = NonFiniteGuard(max_nonfinite_steps, f"{owner}.max_nonfinite_steps")

    def micro_batches(self, rows: int) -> list[slice]:
        """The row slices of a batch of `rows` sequences, one per forward/backward pass."""
        size = self.micro_batch_size or rows
        return [slice(start, start + size) for start in range(0, rows, size)]

    def backward(self, module, rows: int, loss_of: Callable[[slice], Tensor]) -> float:
        """Backpropagate `loss_of(rows)` for each micro-batch; the gradients accumulate and, under
        DDP, are all-reduced once, in the last backward. Each loss must already be normalised by
        the whole step's tokens (`distill.losses.gradient_denominator`). Returns the wall seconds."""
        backward = module.manual_backward if module._trainer is not None else Tensor.backward
        parts = self.micro_batches(rows)
        start = time.perf_counter()
        for i, part in enumerate(parts):
            loss = loss_of(part)
            with gradient_sync(module, last=i == len(parts) - 1):
                backward(loss)
            del loss
        return time.perf_counter() - start

    def optimizer_step(self, module, loss: Tensor | float) -> tuple[Tensor, float]:
        """Clip the student's gradients, step the optimiser and the LR schedule unless the loss or
        the gradient norm is not finite (then the weights, the optimiser state and the schedule
        stay as they were), and zero the gradients. Returns the gradient norm before clipping and
        the wall seconds."""
        start = time.perf_counter()
        clip = self.gradient_clip_val
        grad_norm = full_tensor(torch.nn.utils.clip_grad_norm_(module.student.parameters(), clip or math.inf))
        optimizer = module.optimizers()
        if self.guard.step_ok(loss, grad_norm, module._trainer):
            optimizer.step()
            scheduler = module.lr_schedulers()
            if scheduler is not None:
                scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm, time.perf_counter() - start


class LoopCheckpointing:
    """Mixin (before `L.LightningModule`) for a module whose `StepLoop` is `self.loop`: its guard's
    counts travel in every checkpoint, so a resumed run keeps counting where it stood."""

    loop: StepLoop

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["nonfinite_guard"] = self.loop.guard.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "nonfinite_guard" in checkpoint:
            self.loop.guard.load_state_dict(checkpoint["nonfinite_guard"])


class RatioOfSums(Metric):
    """sum(numerator) / sum(denominator) over an epoch and every rank (0 when nothing was counted):
    accuracy as correct / rows, a KL as summed token values / tokens. The sums are float64 so long
    epochs of small terms stay exact."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("numerator", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("denominator", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, numerator: Tensor, denominator: Tensor) -> None:
        self.numerator += numerator.detach().to(torch.float64)
        self.denominator += denominator.detach().to(torch.float64)

    def compute(self) -> Tensor:
        return self.numerator / self.denominator.clamp(min=1)


class EvalFigures:
    """Mixin (before `L.LightningModule`) for a module whose `_evaluate(batch, prefix)` scores an
    evaluation batch (prefix "val" or "test") and calls `eval_figure(name, numerator, denominator)`.
    At the epoch's end each figure of that stage is logged once as its ratio of sums over all
    batches and ranks (torchmetrics syncs the sums), then dropped. A KL is thus the mean over every
    completion token of the epoch, not a mean of per-batch means."""

    def eval_figure(self, name: str, numerator: Tensor, denominator: Tensor | float) -> None:
        figures = self.__dict__.setdefault("_eval_figures", {})  # plain dict: not in state_dict
        if name not in figures:
            figures[name] = RatioOfSums().to(numerator.device)
        figures[name].update(numerator, torch.as_tensor(denominator, device=numerator.device))

    def chance_figure(self, prefix: str, task: str, rows: list[dict], device) -> None:
        """`<prefix>/<task>/chance`, the accuracy of a uniform guess over the `rows` evaluated
        (1 / options per row, free-form rows 0; rows without options take the task's `chance`),
        for tasks that have one (multiple choice), so that reports can show it beside the accuracy."""
        chance = getattr(get_task(task), "chance", None)
        if chance is not None:
            total = sum(qa.chance(row["options"]) if "options" in row else float(chance) for row in rows)
            self.eval_figure(f"{prefix}/{task}/chance", torch.tensor(total, device=device), len(rows))

    def _log_eval_figures(self, prefix: str) -> None:
        """Log the figures of the stage that ends (`prefix`: "val" or "test") and drop them, so the
        next epoch starts from nothing and never re-logs another stage's figures."""
        figures = self.__dict__.get("_eval_figures", {})
        for name in sorted(n for n in figures if n.startswith(f"{prefix}/")):
            self.log(name, figures.pop(name).compute().float(), add_dataloader_idx=False)

    def _evaluate(self, batch: dict, prefix: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define _evaluate(batch, prefix)")

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._evaluate(batch, "test")

    def on_validation_epoch_end(self) -> None:
        self._log_eval_figures("val")

    def on_test_epoch_end(self) -> None:
        self._log_eval_figures("test")


@torch.no_grad()
def completion_statistics(
    first,
    second,
    rollout: RolloutBatch,
    vocab_size: int,
    budget_mb: float,
    lean: bool = True,
    second_inputs: tuple[Tensor, Tensor] | None = None,
) -> tuple[dict[str, Tensor], Tensor]:
    """Sums over the rollout's completion tokens of `token_statistics(first's logits, second's)`
    (both exact KLs, both entropies; `first` plays the student) and the token count, for the
    evaluation of either module. Rows go in chunks whose logits of both models together stay within
    `budget_mb` MiB; with `lean` only the completion columns go through the LM heads.
    `second_inputs`: the `(input_ids, attention_mask)` `second` reads instead of the rollout's (a
    teacher-only context, `RolloutBatch.teacher_inputs`); the columns then align from the right,
    so only the completion columns are scored whatever `lean` says."""
    ids, attn = rollout.input_ids, rollout.attention_mask
    other_ids, other_attn = (ids, attn) if second_inputs is None else second_inputs
    mask = rollout.completion_mask[:, 1:]
    keep = completion_width(mask) if lean or other_ids is not ids else None
    cols = slice(-keep if keep else None, None)
    itemsize = sum(m.get_output_embeddings().weight.element_size() for m in (first, second))
    sums: dict[str, Tensor] = {}
    chunks = row_chunks(ids.shape[0], keep or mask.shape[1], vocab_size, budget_mb, itemsize)
    with gathered(first, second):  # under FSDP: whole models, so ranks may differ in chunks
        for rows in chunks:
            a = causal_logits(first, ids[rows], attn[rows], vocab_size, keep)
            b = causal_logits(second, other_ids[rows], other_attn[rows], vocab_size, keep)
            stats, m = token_statistics(a, b), mask[rows, cols].float()
            for key in STATISTICS:  # in the statistics' dtype (float32; float64 for float64 models)
                sums[key] = sums.get(key, 0.0) + (stats[key] * m).sum()
            del a, b, stats
    return sums, mask.float().sum()
