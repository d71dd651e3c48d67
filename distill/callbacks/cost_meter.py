"""`CostMeter`: tokens, approximate FLOPs and wall time that a run spends, cumulatively."""

from __future__ import annotations

import time

import lightning as L
import torch

from distill.callbacks.generation import log_scalars
from distill.callbacks.interval import StepInterval
from distill.callbacks.options import check_int

TOKEN_KEYS = (
    "teacher_generated_tokens",
    "student_generated_tokens",
    "teacher_forward_tokens",
    "student_forward_tokens",
)
PHASES = ("rollout", "teacher_forward", "student_forward_backward", "evaluation", "test")


def matmul_parameters(model: torch.nn.Module) -> int:
    """Parameters that a token's forward pass multiplies by: every parameter once (tied weights
    once), minus the input embedding when it is a separate table (a lookup, not a matmul). A tied
    embedding stays: it is also the output projection."""
    total = sum(p.numel() for p in model.parameters())  # parameters() yields a tied weight once
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed_w = getattr(embed, "weight", None)
    if embed_w is not None and (head is None or getattr(head, "weight", None) is not embed_w):
        total -= embed_w.numel()
    return total


def flops(teacher_params: int, student_params: int, tokens: dict[str, int]) -> float:
    """Approximate FLOPs (Kaplan et al. 2020): 2·N per token of a forward-only pass (rollouts, the
    teacher's training forward), 6·N per token trained (the student's forward + backward).
    `tokens`: `teacher_forward_tokens` and `student_forward_tokens` (rollouts) and
    `teacher_train_forward_tokens` and `student_train_tokens`. Attention's sequence-length term
    is ignored."""
    return (
        2.0 * teacher_params * (tokens["teacher_forward_tokens"] + tokens["teacher_train_forward_tokens"])
        + 2.0 * student_params * tokens["student_forward_tokens"]
        + 6.0 * student_params * tokens["student_train_tokens"]
    )


class CostMeter(L.Callback):
    """Cumulative cost of a run, logged under `cost/`:

    - `cost/teacher_generated_tokens`, `cost/student_generated_tokens`: completion tokens each
      model wrote in training rollouts;
    - `cost/teacher_forward_tokens`, `cost/student_forward_tokens`: tokens each model processed,
      in rollouts (prefill + decode; cached teacher rows cost nothing) and in training (the
      teacher's forward and the student's forward/backward over every real token of the step);
    - `cost/flops`: 2·N·tokens for forward-only passes (rollouts, the teacher's training forward)
      plus 6·N·tokens for the student's training; N per model = `matmul_parameters` (all
      parameters, tied ones once, minus a separate input-embedding table);
    - `cost/wall_s`: wall seconds inside `fit`; `cost/time/<phase>` for the phases rollout,
      teacher_forward, student_forward_backward (includes the optimiser step), evaluation
      (validation runs during fit) and test.

    Evaluation compute is not in the token and FLOP counts (it is measurement, not training). A
    rollout reused across steps (`data.refresh_every > 1`: the same `RolloutBatch` object) is
    counted once. Counts are this process's (one device; multiply by the device count under
    data parallelism). Totals survive resuming (checkpoint state).

    Args:
        every_n_steps: log the running totals every N optimiser steps (always at the end of fit).
    """

    def __init__(self, every_n_steps: int = 1):
        self.every_n_steps = check_int("CostMeter", "every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        self.tokens = dict.fromkeys((*TOKEN_KEYS, "teacher_train_forward_tokens", "student_train_tokens"), 0)
        self.times = dict.fromkeys(PHASES, 0.0)
        self.wall_before = 0.0  # fit seconds of earlier (resumed-from) sessions
        self.fit_started: float | None = None
        self.phase_started: float | None = None
        self.params = {"teacher": 0, "student": 0}
        self._last_rollout = None  # kept by reference: identity of a reused rollout stays valid

    # --- hooks ------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_started = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        student = pl_module.student
        teacher = getattr(pl_module, "teacher", None)
        self.params = {
            "student": matmul_parameters(student),
            "teacher": matmul_parameters(teacher) if teacher is not None else 0,
        }

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.interval.batch_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.add_step(outputs, reused=isinstance(batch, dict) and bool(batch.get("reused")))
        if self.interval.due_after(trainer):
            log_scalars(trainer, self.metrics())

    def add_step(self, outputs: dict, reused: bool = False) -> None:
        """Add one training step's costs (the dict `DistillationModule.training_step` returns); a
        rollout batch's own costs count once (`reused`: the DataModule says this one was counted)."""
        rollout = outputs.get("rollout")
        if rollout is not None and not reused and rollout is not self._last_rollout:
            self._last_rollout = rollout
            for key in TOKEN_KEYS:
                self.tokens[key] += int(getattr(rollout, key))
            self.times["rollout"] += float(rollout.rollout_seconds)
        tokens = outputs.get("tokens", {})
        self.tokens["teacher_train_forward_tokens"] += int(tokens.get("teacher_forward", 0))
        self.tokens["student_train_tokens"] += int(tokens.get("student_train", 0))
        for phase, seconds in outputs.get("timings", {}).items():
            if phase in self.times:
                self.times[phase] += float(seconds)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.phase_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        self._end_phase("evaluation")

    def on_test_start(self, trainer, pl_module) -> None:
        self.phase_started = time.perf_counter()

    def on_test_end(self, trainer, pl_module) -> None:
        self._end_phase("test")

    def _end_phase(self, phase: str) -> None:
        if self.phase_started is not None:
            self.times[phase] += time.perf_counter() - self.phase_started
            self.phase_started = None

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        log_scalars(trainer, self.metrics())

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.wall_before = self.wall_s()
        self.fit_started = None

    # --- values -----------------------------------------------------------------------------------
    def wall_s(self) -> float:
        running = time.perf_counter() - self.fit_started if self.fit_started is not None else 0.0
        return self.wall_before + running

    def metrics(self) -> dict[str, float]:
        t = self.tokens
        out = {
            "cost/teacher_generated_tokens": float(t["teacher_generated_tokens"]),
            "cost/student_generated_tokens": float(t["student_generated_tokens"]),
            "cost/teacher_forward_tokens": float(
                t["teacher_forward_tokens"] + t["teacher_train_forward_tokens"]
            ),
            "cost/student_forward_tokens": float(t["student_forward_tokens"] + t["student_train_tokens"]),
            "cost/flops": flops(self.params["teacher"], self.params["student"], t),
            "cost/wall_s": self.wall_s(),
        }
        out |= {f"cost/time/{phase}": seconds for phase, seconds in self.times.items()}
        return out

    def summary(self) -> dict[str, float]:
        return self.metrics()

    def state_dict(self) -> dict:
        # The parameter counts too: a run resumed after training never calls on_train_start.
        return {
            "tokens": dict(self.tokens),
            "times": dict(self.times),
            "wall_s": self.wall_s(),
            "params": dict(self.params),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        self.tokens.update(state_dict["tokens"])
        self.times.update(state_dict["times"])
        self.params.update(state_dict.get("params", {}))
        self.wall_before = float(state_dict["wall_s"])
