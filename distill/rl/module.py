"""`GRPOModule`: reinforcement learning with verifiable rewards (GRPO) from any student.

    distill fit --config configs/tiny/grpo_countdown.yaml
    distill fit --config configs/tiny/grpo_countdown.yaml --model.init_args.student runs/fkl_mix0/student

Each training batch arrives from `RolloutDataModule` with `data.group_size` (G) completions per
prompt, sampled from the current policy (consecutive rows form a group; `data.mix` must be 0). The
task's verifier scores each completion; advantages are the rewards normalised within their group;
the policy then takes `num_iterations` (mu) optimiser steps on the batch with PPO's clipped
surrogate against the sampling policy, plus an optional KL penalty towards the frozen starting
policy. Losses are token sums over completions divided by the completion tokens of the whole step
(micro-batches and ranks included), as in `DistillationModule`.

Steps: `trainer.max_steps` counts optimiser steps, so a run sees max_steps / mu rollout batches
(the last batch takes fewer passes if max_steps is not a multiple of mu). `val_check_interval`
and `log_every_n_steps` count rollout batches (Lightning counts batches), and so does the x axis of
the `train/*` curves.

Measurement callbacks: `training_step` returns a `distill.training.StepResult` as
`DistillationModule`'s does (its cost counts the reference's forward); `student`, `tokenizer`,
`vocab_size` and `logit_grad_sink` mean the same; `teacher` is always None (there is none: a
callback must then skip teacher-side measurements). `reference` is the frozen starting policy
(None unless `kl_coef > 0` or `log_kl_to_start`).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from distill.checks import settings
from distill.losses import gradient_denominator, step_token_count
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
from distill.rl.logprobs import token_logprobs_and_kl
from distill.rl.objective import (
    GRPOBatch,
    GRPOObjective,
    check_sampling,
    clipped_surrogate,
    group_advantages,
    kl_penalty,
    reward_moments,
)
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


def _default_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-6)


class GRPOModule(LoopCheckpointing, EvalFigures, L.LightningModule):
    """Group Relative Policy Optimisation of `student` on the verifier rewards of `data.task`.

    Args:
        student: the starting policy: hub id, local `save_pretrained` directory (e.g. a distillation
            run's `<run_dir>/student`) or `tiny-world:NAME`. Its tokenizer is used.
        reference: the frozen policy of the KL penalty and of `train/kl_to_start`; None = the
            starting policy (`student` as loaded). Must share the student's tokenizer.
        optimizer: optimiser over the policy's parameters only.
        lr_scheduler: optional LR schedule, stepped once per optimiser step (mu per batch).
        objective: passes per batch, clip ranges, KL penalty and advantages (`GRPOObjective`).
        log_kl_to_start: log the exact KL(policy || reference) per token even when kl_coef = 0
            (keeps the reference loaded: one frozen copy of the policy).
        micro_batch_size: sequences per forward/backward pass; None = the whole batch.
        gradient_clip_val: clip the policy's gradient norm to this value (None = no clipping).
        student_dtype: dtype of the policy (`auto`, `float32`, `bfloat16`, `float16`).
        reference_dtype: dtype of the frozen reference; None = the policy's (`student_dtype`), so
            that at step 0 the reference is the policy bit for bit and `train/kl_to_start` is 0. A
            lower precision than the policy's halves its memory but leaves a floor under
            `kl_to_start` (the reference is a rounded copy: its norms and residuals run in its
            dtype, the policy's in float32 even under autocast), which can swamp the drift at lr 1e-6.
        max_nonfinite_steps: an optimiser step with a non-finite loss or gradient norm is skipped
            (counted as `train/nonfinite_steps`); this many in a row stop the run as diverged.
        text_log: scored completions logged as text to TensorBoard, every N rollout batches.
        execution: how the models run, as in `DistillationModule` (`distill.training.Execution`),
            the reference in the teacher's place (it never decodes, so compiled decoding compiles
            the policy only; its scoring passes are compiled with `compile_forwards`).
            Log-probabilities are computed in chunks of positions (`distill.rl.logprobs`), as the
            divergences are.
    """

    def __init__(
        self,
        student: str,
        reference: str | None = None,
        optimizer: OptimizerCallable = _default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = None,
        objective: GRPOObjective = GRPOObjective(),
        log_kl_to_start: bool = True,
        micro_batch_size: int | None = None,
        gradient_clip_val: float | None = 1.0,
        student_dtype: str = "float32",
        reference_dtype: str | None = None,
        max_nonfinite_steps: int = 5,
        text_log: TextLog = TextLog(every=50, samples=4),
        execution: Execution = Execution(),
    ):
        super().__init__()
        self.objective = settings(GRPOObjective, objective, "model.objective")
        self.text_log = settings(TextLog, text_log, "model.text_log")
        self.execution = settings(Execution, execution, "model.execution")
        groups = {"objective": self.objective, "text_log": self.text_log, "execution": self.execution}
        self.save_hyperparameters(ignore=["optimizer", "lr_scheduler", *groups])
        # Plain mappings in the hyper-parameters (and so in checkpoints), read back by `settings`.
        self.hparams.update({name: asdict(group) for name, group in groups.items()})
        self.loop = StepLoop(micro_batch_size, gradient_clip_val, max_nonfinite_steps)
        optimizer = resolve_callable(optimizer, "model.optimizer")
        check_optimizer(optimizer, lr_scheduler)
        resolve_dtype(student_dtype, "model.student_dtype")
        if reference_dtype is not None:
            resolve_dtype(reference_dtype, "model.reference_dtype")
        self.student_path = check_model_path(student, "model.student")
        self.tokenizer = load_tokenizer(self.student_path)
        self.use_reference = self.objective.kl_coef > 0 or log_kl_to_start
        self.reference_path = (
            check_model_path(reference, "model.reference") if reference else self.student_path
        )
        if reference:
            check_same_tokenizer(load_tokenizer(self.reference_path), self.tokenizer, reference, student)
        self.vocab_size = len(self.tokenizer)
        self.optimizer_factory, self.scheduler_factory = optimizer, lr_scheduler
        self.automatic_optimization = False
        self.strict_loading = False  # checkpoints hold no reference tensors
        self.student = None
        self.reference = None
        self.teacher = None  # GRPO has no teacher; measurement callbacks must tolerate None
        # Set by GradientStats: receives dL/dz of the logits.
        self.logit_grad_sink: LogitGradSink | None = None
        self._register_state_dict_hook(drop_from_state_dict("reference"))

    # --- models -----------------------------------------------------------------------------------
    def configure_model(self) -> None:
        if self.student is None:
            self.load_models()
        shard_model(self.student, self.device_mesh, "model.student")  # FSDP2 under ModelParallelStrategy
        eager_if_sharded(self.student)

    def load_models(self) -> None:
        hp, run = self.hparams, self.execution
        attn = {"attn_implementation": run.attn_implementation}
        self.student = load_model(
            self.student_path, hp.student_dtype, gradient_checkpointing=run.gradient_checkpointing, **attn
        )
        models = [self.student]
        if self.use_reference:
            dtype = hp.student_dtype if hp.reference_dtype is None else hp.reference_dtype
            self.reference = load_model(self.reference_path, dtype, trainable=False, **attn)
            models.append(self.reference)
        vocab_size(self.tokenizer, *models)
        decoding, forwards = compile_flags(run.compile_decoding, run.compile_forwards)
        if decoding:
            compile_decoding(self.student)
        if forwards:
            for model in models:
                compile_forwards(model)
        keep_out_of_ddp(self, "reference")  # not in DDP's start-up broadcast

    def on_train_start(self) -> None:
        if self.reference is not None:
            self.reference.eval()  # the Trainer restores submodule modes (Lightning >= 2.2)

    def on_validation_model_train(self) -> None:
        super().on_validation_model_train()
        self.on_train_start()  # the reference back in eval mode

    def configure_optimizers(self):
        return student_optimizers(self.student, self.optimizer_factory, self.scheduler_factory)

    # --- training ---------------------------------------------------------------------------------
    def training_step(self, batch: dict, batch_idx: int) -> dict:
        """`num_iterations` optimiser steps on one rollout batch; returns `StepResult(...).output()`
        (the mean loss over passes, the last pass's gradient norm, the policy's and the reference's
        tokens and seconds)."""
        step = self.prepare(batch)  # 1. the rollout's rewards and group advantages
        passes = self.optimizer_steps_per_batch()
        totals: dict[str, float] = {}
        first_pass: dict[str, float] = {}
        grad_norm, step_s = torch.zeros(()), 0.0  # step_s: clipping and optimiser steps
        for p in range(passes):
            sums = self.accumulate_gradients(step, first=p == 0)  # 2. log-probs, surrogate, backward
            grad_norm, seconds = self.loop.optimizer_step(self, sums["loss"])  # 3. clip, step, schedule
            first_pass = first_pass or sums
            totals = {k: totals.get(k, 0.0) + v for k, v in sums.items()}
            step_s += seconds
        tokens = float(step.num_items.clamp(min=1))
        logged = {
            "loss": totals["loss"] / passes,
            "clip_fraction": totals["clipped"] / (tokens * passes),
            # Both KL figures are the sampling policy's (first pass), per completion token.
            "kl_to_start": first_pass["kl_to_start"] / tokens,
            "kl_penalty": first_pass["kl_penalty"] / tokens,
        }
        self._log_step(step, logged, passes, grad_norm)  # 4. what the step measured
        real_tokens = int(step.rollout.attention_mask.sum())
        # The policy reads every real token once per pass; the reference once per batch.
        cost = StepCost(
            student_train_tokens=real_tokens * passes,
            reference_forward_tokens=real_tokens if self.reference is not None else 0,
            student_forward_backward_s=totals["policy_s"] + step_s,
            reference_forward_s=totals["reference_s"],
        )
        return StepResult(
            torch.tensor(logged["loss"]),
            step.rollout,
            int(step.num_items),
            float(grad_norm),
            cost,
            bool(batch.get("reused", False)),
        ).output()

    def rewards(self, batch: dict) -> tuple[torch.Tensor, list[str]]:
        """Verifier score of each completion (`[B]` float32) and the completions' texts. A subclass
        may score otherwise (tests fix rewards); training and evaluation both call this."""
        task = get_task(batch["task"])
        texts = batch["rollout"].completions(self.tokenizer)
        scores = [task.score(text, row) for text, row in zip(texts, batch["rows"])]
        return torch.tensor(scores, dtype=torch.float32, device=batch["rollout"].input_ids.device), texts

    def prepare(self, batch: dict) -> GRPOBatch:
        """Rewards, advantages and masks of a training batch (log-prob buffers still empty). The
        batch names its group size and its sampling temperature (`RolloutDataModule` puts both in)."""
        group_size, temperature = int(batch["group_size"]), float(batch["temperature"])
        check_sampling(group_size, temperature)
        rollout = batch["rollout"]
        rewards, texts = self.rewards(batch)
        goal = self.objective
        advantages, zero_signal = group_advantages(
            rewards, group_size, goal.scale_rewards, goal.advantage_epsilon
        )
        mask = rollout.completion_mask[:, 1:]
        return GRPOBatch(
            rollout=rollout,
            rewards=rewards,
            texts=texts,
            advantages=advantages,
            zero_signal=zero_signal,
            mask=mask,
            num_items=step_token_count([mask]),
            old_logp=torch.zeros(mask.shape, device=mask.device),
            ref_logp=torch.zeros(mask.shape, device=mask.device),
            temperature=temperature,
        )

    def accumulate_gradients(self, step: GRPOBatch, first: bool) -> dict[str, float]:
        """One pass of backward over `step` in micro-batches (`StepLoop.backward`), each token's loss
        divided by the completion tokens of the whole step (micro-batches and ranks included). The
        first pass (`first`) runs with the sampling policy's parameters, before any optimiser step:
        it stores its detached log-probs as the old log-probs of later passes (saving a no-grad
        forward) and the reference's log-probs. Returns token sums (`loss`: the pass's loss,
        already normalised) and wall seconds per phase."""
        ids, attn = step.rollout.input_ids, step.rollout.attention_mask
        tokens, mask, temperature = ids[:, 1:], step.mask, step.temperature
        denom = gradient_denominator(step.num_items.clamp(min=1))  # num_items / world size
        goal, lean = self.objective, self.execution.lean_logits
        sums = dict.fromkeys(("loss", "clipped", "kl_to_start", "kl_penalty", "reference_s"), 0.0)

        def micro_batch_loss(batch_rows: slice) -> torch.Tensor:
            keep = completion_width(mask[batch_rows]) if lean else None  # the last K columns
            rows = (batch_rows, slice(-keep if keep else None, None))
            m, ref_logits = mask[rows].float(), None
            t0 = time.perf_counter()
            if first and self.reference is not None:
                with torch.no_grad():
                    ref_logits = causal_logits(
                        self.reference, ids[batch_rows], attn[batch_rows], self.vocab_size, keep
                    )
                    step.ref_logp[rows] = token_logprobs_and_kl(ref_logits, tokens[rows], temperature)[0]
            sums["reference_s"] += time.perf_counter() - t0
            logits = causal_logits(self.student, ids[batch_rows], attn[batch_rows], self.vocab_size, keep)
            if self.logit_grad_sink is not None:
                record = partial(self.logit_grad_sink.record, completion_mask=mask[rows], num_items=denom)
                logits.register_hook(partial(record, teacher_token_mask=torch.zeros_like(mask[rows])))
            # The first pass's KL to the reference comes from the log-probs' own softmaxes.
            logp, kl_to_start = token_logprobs_and_kl(logits, tokens[rows], temperature, ref_logits)
            if first:
                step.old_logp[rows] = logp.detach()
                if kl_to_start is not None:
                    sums["kl_to_start"] += float((kl_to_start * m).sum())
            per_token, cut = clipped_surrogate(
                logp, step.old_logp[rows], step.advantages[batch_rows], *goal.clip_range
            )
            if goal.kl_coef > 0:
                kl = kl_penalty(logp, step.ref_logp[rows], goal.kl_estimator)
                per_token = per_token + goal.kl_coef * kl
                sums["kl_penalty"] += float((kl.detach() * m).sum())
            loss = (per_token * m).sum() / denom
            sums["loss"] += float(loss.detach())
            sums["clipped"] += float((cut.float() * m).sum())
            return loss

        total_s = self.loop.backward(self, ids.shape[0], micro_batch_loss)
        return {**sums, "policy_s": total_s - sums["reference_s"]}

    def optimizer_steps_per_batch(self) -> int:
        """Optimiser steps the coming batch takes: `num_iterations`, cut so that the run never steps
        past `max_steps` (which counts optimiser steps). Measurement intervals read it too."""
        passes = self.objective.num_iterations
        if self.trainer.max_steps > 0:
            passes = max(1, min(passes, self.trainer.max_steps - self.global_step))
        return passes

    def _log_step(self, step: GRPOBatch, logged: dict, passes: int, grad_norm) -> None:
        # Over every rank: ranks hold equal rows and groups (a mean of rank means is the global one);
        # `logged` holds local token sums / global tokens, which add up (the loss averages, see denom).
        n, (reward_mean, reward_std) = len(step.rewards), reward_moments(step.rewards)
        mean = dict(batch_size=n, sync_dist=True)
        add = dict(batch_size=n, sync_dist=True, reduce_fx="sum")
        self.log("train/loss", logged["loss"], prog_bar=True, **mean)
        self.log("train/reward_mean", reward_mean, prog_bar=True, batch_size=n)
        self.log("train/reward_std", reward_std, batch_size=n)
        self.log("train/zero_signal_groups", step.zero_signal.float().mean(), **mean)
        self.log("train/clip_fraction", logged["clip_fraction"], **add)
        if self.reference is not None:
            self.log("train/kl_to_start", logged["kl_to_start"], prog_bar=True, **add)
        if self.objective.kl_coef > 0:
            self.log("train/kl_penalty", logged["kl_penalty"], **add)
        self.log("train/completion_length", step.rollout.completion_mask.sum(-1).float().mean(), **mean)
        self.log("train/truncated_share", step.rollout.truncated_rows / n, **mean)  # cut at max_new_tokens
        if step.rollout.policy_lag is not None:  # steps between the policy and the engine that wrote
            self.log("train/policy_lag", float(step.rollout.policy_lag), batch_size=n)
        self.log("train/grad_norm", float(grad_norm), batch_size=n)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], batch_size=n)
        self.log("train/nonfinite_steps", float(self.loop.guard.skipped), batch_size=n)
        every = self.text_log.every
        batch_index = (self.global_step - passes) // self.objective.num_iterations  # rollout batches so far
        if every and batch_index % every == 0:
            texts = step.rollout.render(self.tokenizer)[: self.text_log.samples]
            log_texts(
                self, "completions", [f"[reward {float(r):g}] {t}" for r, t in zip(step.rewards, texts)]
            )

    # --- evaluation -------------------------------------------------------------------------------
    def _evaluate(self, batch: dict, prefix: str) -> None:
        rollout, rows, task = batch["rollout"], batch["rows"], batch["task"]
        scores, _ = self.rewards(batch)
        self.eval_figure(f"{prefix}/{task}/accuracy", scores.sum(), len(rows))
        self.chance_figure(prefix, task, rows, scores.device)
        if self.reference is None:
            return
        run = self.execution
        sums, count = completion_statistics(
            self.student, self.reference, rollout, self.vocab_size, run.eval_logit_budget_mb, run.lean_logits
        )
        self.eval_figure(f"{prefix}/{task}/kl_to_start", sums["reverse_kl"], count)

    # --- export -----------------------------------------------------------------------------------
    def export_student(self, path: str | Path) -> Path:
        """`save_pretrained` the policy and its tokenizer (loadable with the Auto* classes)."""
        return export_pretrained(self.student, self.tokenizer, path)
