"""`CostMeter`: tokens, approximate FLOPs and wall time that a run spends, cumulatively."""

from __future__ import annotations

import time

import lightning as L
import torch

from distill.callbacks.generation import log_scalars
from distill.callbacks.interval import StepInterval
from distill.checks import check_int
from distill.losses import global_sum
from distill.training import StepResult, step_result

TOKEN_KEYS = (
    "teacher_generated_tokens",
    "student_generated_tokens",
    "teacher_forward_tokens",
    "student_forward_tokens",
)
PHASES = ("rollout", "teacher_forward", "reference_forward", "student_forward_backward", "evaluation", "test")
# Training-side token counters, filled from each step's `StepCost`.
TRAIN_KEYS = ("teacher_train_forward_tokens", "reference_forward_tokens", "student_train_tokens")


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


def flops(params: dict[str, int], tokens: dict[str, int]) -> float:
    """Approximate FLOPs (Kaplan et al. 2020): 2·N per token of a forward-only pass (rollouts, the
    teacher's training forward, GRPO's reference forward), 6·N per token trained (the student's
    forward + backward). `params`: N of `teacher`, `student` and `reference`; `tokens`:
    `teacher_forward_tokens` and `student_forward_tokens` (rollouts), `teacher_train_forward_tokens`,
    `reference_forward_tokens` and `student_train_tokens`. Attention's sequence-length term is
    ignored."""
    return (
        2.0 * params["teacher"] * (tokens["teacher_forward_tokens"] + tokens["teacher_train_forward_tokens"])
        + 2.0 * params["reference"] * tokens["reference_forward_tokens"]
        + 2.0 * params["student"] * tokens["student_forward_tokens"]
        + 6.0 * params["student"] * tokens["student_train_tokens"]
    )


class CostMeter(L.Callback):
    """Cumulative cost of a run, logged under `cost/`:

    - `cost/teacher_generated_tokens`, `cost/student_generated_tokens`: completion tokens each
      model wrote in training rollouts;
    - `cost/teacher_forward_tokens`, `cost/student_forward_tokens`: tokens each model processed,
      in rollouts (prefill + decode; cached teacher rows cost nothing) and in training (the
      teacher's forward and the student's forward/backward over every real token of the step);
    - `cost/reference_forward_tokens`: tokens GRPO's frozen reference read (0 without one);
    - `cost/flops`: 2·N·tokens for forward-only passes (rollouts, the teacher's training forward,
      the reference's forward) plus 6·N·tokens for the student's training; N per model =
      `matmul_parameters` (all parameters, tied ones once, minus a separate input-embedding table);
    - `cost/wall_s`: wall seconds inside `fit`; `cost/time/<phase>` for the phases rollout,
      teacher_forward, reference_forward, student_forward_backward (includes the optimiser step),
      evaluation (validation runs during fit) and test.

    It reads each step's `distill.training.StepResult`. Evaluation compute is not in the token
    and FLOP counts (it is measurement, not training). A rollout reused across steps
    (`data.refresh_every > 1`, `StepResult.reused_rollout`) is counted once. Under data
    parallelism token counts and FLOPs are every rank's (summed over ranks), wall times this
    process's. Totals survive resuming (checkpoint state).

    Args:
        every_n_steps: log the running totals every N optimiser steps (always at the end of fit).
    """

    def __init__(self, every_n_steps: int = 1):
        self.every_n_steps = check_int("CostMeter.every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        self.tokens = dict.fromkeys((*TOKEN_KEYS, *TRAIN_KEYS), 0)
        self.times = dict.fromkeys(PHASES, 0.0)
        self.wall_before = 0.0  # fit seconds of earlier (resumed-from) sessions
        self.fit_started: float | None = None
        self.phase_started: float | None = None
        self.params = {"teacher": 0, "student": 0, "reference": 0}

    # --- hooks ------------------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_started = time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def size(name: str) -> int:  # a module without that model (GRPO's teacher) costs 0
            model = getattr(pl_module, name, None)
            return matmul_parameters(model) if model is not None else 0

        self.params = {name: size(name) for name in ("student", "teacher", "reference")}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.interval.batch_start(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = step_result(outputs)
        if step is not None:
            self.add_step(step, pl_module.device)
        if self.interval.due_after(trainer):
            log_scalars(trainer, self.metrics())

    def add_step(self, step: StepResult, device: torch.device | str = "cpu") -> None:
        """Add one training batch's costs; a rollout's own costs count once (not when reused).
        Tokens are every rank's (summed over ranks on `device`, the module's: a collective, which
        NCCL takes on the GPU only); wall times are this rank's."""
        cost = step.cost
        tokens = dict.fromkeys(TOKEN_KEYS, 0)
        if not step.reused_rollout:
            tokens = {key: int(getattr(step.rollout, key)) for key in TOKEN_KEYS}
            self.times["rollout"] += float(step.rollout.rollout_seconds)
        tokens["teacher_train_forward_tokens"] = cost.teacher_forward_tokens
        tokens["reference_forward_tokens"] = cost.reference_forward_tokens
        tokens["student_train_tokens"] = cost.student_train_tokens
        summed = global_sum(torch.tensor(list(tokens.values()), dtype=torch.float64, device=device))
        for key, value in zip(tokens, summed.tolist()):
            self.tokens[key] += int(value)
        self.times["teacher_forward"] += cost.teacher_forward_s
        self.times["reference_forward"] += cost.reference_forward_s
        self.times["student_forward_backward"] += cost.student_forward_backward_s

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
            "cost/reference_forward_tokens": float(t["reference_forward_tokens"]),
            "cost/flops": flops(self.params, t),
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
