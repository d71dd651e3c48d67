"""`DistillationModule`: a trainable student, a frozen teacher and a pluggable token-level divergence.

Rollouts arrive from `RolloutDataModule` (already written by the student/teacher mixture); each
optimiser step is one rollout batch, split into micro-batches whose losses are normalised by the
completion tokens of the whole step (across ranks), so 8 x 1 and 1 x 8 give the same update. This
is why optimisation is manual: Lightning's own accumulation divides each micro-batch's mean by the
number of micro-batches, which mis-weights completions of different lengths (TRL issue #4719).
The micro-batch loop and the optimiser step are `distill.training.StepLoop`, which GRPO runs too.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path

import lightning as L
import torch
from jsonargparse import lazy_instance
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from distill.checks import settings
from distill.losses import ForwardKL, TokenDivergence, global_sum, gradient_denominator, step_token_count
from distill.models.compiled import compile_flags, compile_forwards
from distill.models.forward import causal_logits, completion_width, drop_from_state_dict, export_pretrained
from distill.models.loading import (
    check_model_path,
    check_same_tokenizer,
    load_model,
    load_tokenizer,
    resolve_dtype,
    vocab_size,
)
from distill.parallel import keep_out_of_ddp, shard_model
from distill.rollout.compiled import compile_decoding, eager_if_sharded
from distill.tasks.registry import get_task
from distill.training import (
    EvalFigures,
    Execution,
    LogitGradSink,
    LoopCheckpointing,
    StepCost,
    StepLoop,
    StepResult,
    TextLog,
    check_optimizer,
    completion_statistics,
    log_texts,
    resolve_callable,
    student_optimizers,
)

# LightningCLI-friendly default (serialisable in --print_config); one instance per module built from it.
DEFAULT_DIVERGENCE = lazy_instance(ForwardKL)


def _default_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-4)


@dataclass
class StepMeans:
    """A distillation step's per-token means over its completion tokens (logged as `train/<name>`):
    the optimised loss and, whatever is optimised, both exact KL directions and both entropies."""

    loss: torch.Tensor
    forward_kl: torch.Tensor
    reverse_kl: torch.Tensor
    student_entropy: torch.Tensor
    teacher_entropy: torch.Tensor


class DistillationModule(LoopCheckpointing, EvalFigures, L.LightningModule):
    """Distil `teacher` into `student` with `divergence` on the rollouts the DataModule samples.

    Args:
        student: hub id or local directory of the model to train (its tokenizer is used).
        teacher: hub id or local directory of the frozen teacher (same tokenizer required).
        divergence: the token-level divergence to minimise (`distill.losses`, e.g. ForwardKL).
        optimizer: optimiser over the student's parameters only (the teacher is never in it).
        lr_scheduler: optional LR schedule, stepped once per optimiser step.
        micro_batch_size: sequences per forward/backward pass; None = the whole step's batch.
        gradient_clip_val: clip the student's gradient norm to this value (None = no clipping).
        student_dtype: dtype the student is loaded in (`auto`, `float32`, `bfloat16`, `float16`).
        teacher_dtype: dtype the teacher is loaded in; `auto` = its checkpoint's (bf16 for the
            paper's hub teachers: 16 GB for an 8B, not 32 GB in float32; float32 for the tiny world).
        max_nonfinite_steps: a step with a non-finite loss or gradient norm is skipped (weights
            untouched; counted as `train/nonfinite_steps`); this many in a row stop the run as
            diverged (`distill.training.NonFiniteGuard`).
        text_log: rollouts logged as text to TensorBoard, teacher-written spans marked (`TextLog`).
        execution: how the models run: lean logits, evaluation budget, checkpointing, attention
            kernel, compiled decoding and forwards (`distill.training.Execution`).
    """

    def __init__(
        self,
        student: str,
        teacher: str,
        divergence: TokenDivergence = DEFAULT_DIVERGENCE,
        optimizer: OptimizerCallable = _default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        micro_batch_size: int | None = None,
        gradient_clip_val: float | None = 1.0,
        student_dtype: str = "float32",
        teacher_dtype: str = "auto",
        max_nonfinite_steps: int = 5,
        text_log: TextLog = TextLog(every=50, samples=2),
        execution: Execution = Execution(),
    ):
        super().__init__()
        self.text_log = settings(TextLog, text_log, "model.text_log")
        self.execution = settings(Execution, execution, "model.execution")
        self.save_hyperparameters(ignore=["divergence", "optimizer", "lr_scheduler", "text_log", "execution"])
        # Plain mappings in the hyper-parameters (and so in checkpoints), read back by `settings`.
        self.hparams.update(text_log=asdict(self.text_log), execution=asdict(self.execution))
        self.loop = StepLoop(micro_batch_size, gradient_clip_val, max_nonfinite_steps)
        optimizer = resolve_callable(optimizer, "model.optimizer")
        check_optimizer(optimizer, lr_scheduler)
        resolve_dtype(student_dtype, "model.student_dtype")
        resolve_dtype(teacher_dtype, "model.teacher_dtype")
        # Fail before any model is loaded: paths exist, tokenizers agree (tokenizers are cheap).
        self.student_path = check_model_path(student, "model.student")
        self.teacher_path = check_model_path(teacher, "model.teacher")
        self.tokenizer = load_tokenizer(self.student_path)
        check_same_tokenizer(load_tokenizer(self.teacher_path), self.tokenizer, teacher, student)
        self.vocab_size = len(self.tokenizer)
        self.divergence = divergence
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold no teacher tensors
        self.student = None
        self.teacher = None
        self.logit_grad_sink: LogitGradSink | None = (
            None  # set by GradientStats: receives dL/dz of the logits
        )
        self._register_state_dict_hook(drop_from_state_dict("teacher"))

    # --- models -----------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.student is None:
            self.load_models()
        shard_model(self.student, self.device_mesh, "model.student")  # FSDP2 under ModelParallelStrategy
        eager_if_sharded(self.student)

    def load_models(self) -> None:
        hp, run = self.hparams, self.execution
        self.student = load_model(
            self.student_path,
            hp.student_dtype,
            trainable=True,
            attn_implementation=run.attn_implementation,
            gradient_checkpointing=run.gradient_checkpointing,
        )
        self.teacher = load_model(
            self.teacher_path, hp.teacher_dtype, trainable=False, attn_implementation=run.attn_implementation
        )
        vocab_size(self.tokenizer, self.student, self.teacher)  # both cover the tokenizer
        decoding, forwards = compile_flags(run.compile_decoding, run.compile_forwards)
        if decoding:
            compile_decoding(self.student)
            compile_decoding(self.teacher)
        if forwards:
            compile_forwards(self.student)
            compile_forwards(self.teacher)
        keep_out_of_ddp(self, "teacher")  # not in DDP's start-up broadcast (16 GB at paper scale)

    def on_train_start(self) -> None:
        # The Trainer restores each submodule's mode (Lightning >= 2.2): keep the teacher in eval.
        self.teacher.eval()

    def on_validation_model_train(self) -> None:
        super().on_validation_model_train()
        self.teacher.eval()

    def configure_optimizers(self):
        return student_optimizers(self.student, self.optimizer_factory, self.scheduler_factory)

    # --- training ---------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> dict:
        """One optimiser step on one rollout batch. Returns `StepResult(...).output()`, which
        measurement callbacks read in `on_train_batch_end` (`distill.training.step_result`)."""
        rollout = batch["rollout"]  # 1. sampled by the DataModule's student/teacher mixture
        means, num_items, timings = self.accumulate_gradients(rollout)  # 2. logits, divergence, backward
        grad_norm, step_s = self.loop.optimizer_step(self, means.loss)  # 3. clip, step, schedule
        self._log_step(batch, means, grad_norm)  # 4. what the step measured
        real_tokens = int(rollout.attention_mask.sum())  # both models read every real token once
        cost = StepCost(
            student_train_tokens=real_tokens,
            teacher_forward_tokens=real_tokens,
            student_forward_backward_s=timings["student_forward_backward"] + step_s,
            teacher_forward_s=timings["teacher_forward"],
        )
        return StepResult(
            means.loss, rollout, int(num_items), float(grad_norm), cost, bool(batch.get("reused", False))
        ).output()

    def accumulate_gradients(self, rollout) -> tuple[StepMeans, torch.Tensor, dict]:
        """Backpropagate the divergence over `rollout` in micro-batches (`StepLoop.backward`), each
        normalised by the completion tokens of the whole step (every rank's; under DDP/FSDP by
        `gradient_denominator`, so the ranks' averaged gradient is the single-process one).
        Returns the step's per-token means over every rank's tokens, the global token count and
        wall seconds per phase."""
        mask = rollout.completion_mask[:, 1:]  # aligned with the logits (position t predicts t+1)
        teacher_written = rollout.teacher_token_mask[:, 1:]
        tokens = rollout.input_ids[:, 1:]
        num_items = step_token_count([mask])
        denom = gradient_denominator(num_items)  # num_items / world size
        keys = [f.name for f in fields(StepMeans)][1:]
        sums = torch.zeros(len(keys) + 1, device=mask.device)
        teacher_s = 0.0

        def micro_batch_loss(rows: slice) -> torch.Tensor:
            nonlocal sums, teacher_s
            keep = self.logit_columns(rollout, rows)  # lean: the last K columns, masks cut alike
            cols = slice(-keep if keep else None, None)
            m = mask[rows, cols]
            t0 = time.perf_counter()
            teacher = self.teacher_logits(rollout, rows, keep)
            teacher_s += time.perf_counter() - t0
            student = self.student_logits(rollout, rows, keep)
            if self.logit_grad_sink is not None:
                hook = partial(self.logit_grad_sink.record, completion_mask=m, num_items=denom)
                student.register_hook(partial(hook, teacher_token_mask=teacher_written[rows, cols]))
            loss, stats = self.divergence(
                student, teacher, m, tokens=tokens[rows, cols], num_items=denom, return_statistics=True
            )
            m = m.float()
            sums += torch.stack([loss.detach() * denom] + [(stats[k] * m).sum() for k in keys])
            return loss

        total_s = self.loop.backward(self, rollout.input_ids.shape[0], micro_batch_loss)
        timings = {"teacher_forward": teacher_s, "student_forward_backward": total_s - teacher_s}
        return StepMeans(*(global_sum(sums) / num_items.clamp(min=1))), num_items, timings

    def logit_columns(self, rollout, rows: slice = slice(None)) -> int | None:
        """K, the last columns of the logits both models compute (`completion_width`: those that
        predict completion tokens), or None for every position. Lean passes use K; so does a
        teacher-only context whatever `lean_logits` says, since the teacher's positions line up
        with the student's only from the right (its prompt has another width)."""
        if self.execution.lean_logits or rollout.teacher_input_ids is not None:
            return completion_width(rollout.completion_mask[rows, 1:])
        return None

    def student_logits(self, rollout, rows: slice = slice(None), keep: int | None = None) -> torch.Tensor:
        """The student's logits over `rollout`'s rows: the last `keep` positions (None: all)."""
        ids, attn = rollout.input_ids[rows], rollout.attention_mask[rows]
        return causal_logits(self.student, ids, attn, self.vocab_size, keep)

    def teacher_logits(self, rollout, rows: slice = slice(None), keep: int | None = None) -> torch.Tensor:
        """The teacher's, read from its own view (`RolloutBatch.teacher_inputs`: with a teacher-only
        context another prompt before the same completion), under no_grad (not inference_mode:
        they meet autograd)."""
        ids, attn = rollout.teacher_inputs()
        with torch.no_grad():
            return causal_logits(self.teacher, ids[rows], attn[rows], self.vocab_size, keep)

    def pair_logits(self, rollout, rows: slice = slice(None)) -> tuple[torch.Tensor, torch.Tensor]:
        """(student, teacher) logits over the same columns (`logit_columns`)."""
        keep = self.logit_columns(rollout, rows)
        return self.student_logits(rollout, rows, keep), self.teacher_logits(rollout, rows, keep)

    def _log_step(self, batch: dict, means: StepMeans, grad_norm) -> None:
        rollout = batch["rollout"]
        for name, value in vars(means).items():
            self.log(f"train/{name}", value, prog_bar=name in ("loss", "forward_kl", "reverse_kl"))
        # Over every rank's rollouts: teacher-written / completion tokens, completion tokens / rows.
        mask = rollout.completion_mask
        rows_cut = torch.tensor([mask.shape[0], rollout.truncated_rows], device=mask.device)
        counts = torch.cat([torch.stack([rollout.teacher_token_mask.sum(), mask.sum()]), rows_cut])
        teacher, completion, rows, truncated = global_sum(counts.float()).tolist()
        self.log("train/teacher_share", teacher / completion if completion else 0.0)
        self.log("train/completion_length", completion / max(rows, 1.0))
        self.log("train/truncated_share", truncated / max(rows, 1.0))  # rows cut at max_new_tokens
        if rollout.policy_lag is not None:  # steps between the student and the engine that wrote
            self.log("train/policy_lag", float(rollout.policy_lag))
        self.log("train/grad_norm", grad_norm)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"])
        self.log("train/nonfinite_steps", float(self.loop.guard.skipped))
        every = self.text_log.every
        if every and (self.global_step - 1) % every == 0:
            n = self.text_log.samples
            rendered = rollout.render(self.tokenizer)[:n]
            task, rows = get_task(batch["task"]), batch["rows"][:n]
            scores = [
                task.score(text, row) for text, row in zip(rollout.completions(self.tokenizer)[:n], rows)
            ]
            texts = [f"[score {score:g}] {text}" for score, text in zip(scores, rendered)]
            log_texts(
                self,
                "rollouts",
                texts,
                header="verifier score, then the rollout; teacher-written spans in ⟦ ⟧\n\n",
            )

    # --- evaluation -------------------------------------------------------------------------------
    def _evaluate(self, batch: dict, prefix: str) -> None:
        rollout, rows, task = batch["rollout"], batch["rows"], batch["task"]
        texts = rollout.completions(self.tokenizer)
        # On the rollout's device: torchmetrics sums these over ranks (NCCL: GPU tensors only).
        scores = torch.tensor(
            [get_task(task).score(t, r) for t, r in zip(texts, rows)], device=rollout.input_ids.device
        )
        self.eval_figure(f"{prefix}/{task}/accuracy", scores.sum(), len(rows))
        self.chance_figure(prefix, task, rows, scores.device)
        sums, count = completion_statistics(
            self.student,
            self.teacher,
            rollout,
            self.vocab_size,
            self.execution.eval_logit_budget_mb,
            self.execution.lean_logits,
            second_inputs=rollout.teacher_inputs(),
        )
        for key in ("forward_kl", "reverse_kl"):
            self.eval_figure(f"{prefix}/{task}/{key}", sums[key], count)

    # --- export -----------------------------------------------------------------------------------
    def export_student(self, path: str | Path) -> Path:
        """`save_pretrained` the student and its tokenizer (loadable with the Auto* classes). Every
        rank calls it (a sharded student is gathered); rank 0 writes."""
        return export_pretrained(self.student, self.tokenizer, path)
