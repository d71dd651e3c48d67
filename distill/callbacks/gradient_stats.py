"""`GradientStats`: how hard the divergence pulls on the student's logits, token by token."""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor

from distill.callbacks.contract import LogitGradSource, require
from distill.callbacks.generation import log_scalars
from distill.callbacks.interval import StepInterval
from distill.checks import check_int
from distill.losses import global_sum
from distill.training import step_result

SPLITS = ("", "_teacher_tokens", "_student_tokens")


class GradientStats(L.Callback):
    """Per optimiser step, the mean over completion tokens of ‖∂ℓ_t/∂z_t‖², where z_t are the
    student's logits at position t and ℓ_t the token-level divergence there.

    The module's loss is L = Σ_t ℓ_t / num_items (num_items: completion tokens in the step), so the
    hook's dL/dz_t is multiplied by num_items to give ∂ℓ_t/∂z_t (for forward KL at temperature 1
    that is p_S - p_T). Logged: `grad/logit_sq_norm` (all completion tokens),
    `grad/logit_sq_norm_teacher_tokens` and `grad/logit_sq_norm_student_tokens` (tokens the teacher
    / the student wrote; a split with no tokens in the step is not logged) and `grad/param_norm`
    (the student's parameter-gradient norm before clipping). Micro-batches of one step are
    accumulated into one value, and so are the ranks' tokens under data parallelism. Gradients
    are taken over the real vocabulary (the logits the divergence sees).

    `summary()` gives run means: token-weighted over all measured steps for the logit norms, the
    mean over measured steps for `grad/param_norm`, and, when the module clips
    (`model.gradient_clip_val`), `grad/clip_share`: the share of measured steps whose norm exceeded
    the clip, i.e. how often clipping changed the update.

    Args:
        every_n_steps: measure every N optimiser steps (the hook is idle on other steps).
    """

    def __init__(self, every_n_steps: int = 1):
        self.every_n_steps = check_int("GradientStats.every_n_steps", every_n_steps, 1)
        self.interval = StepInterval(self.every_n_steps)
        self.active = False
        self._reset_step()
        # Run totals: squared-norm sums and token counts per split, and param-norm sum and count.
        self.totals = {"sq": [0.0, 0.0, 0.0], "count": [0, 0, 0], "param_norm": 0.0, "steps": 0, "clipped": 0}
        self.clip: float | None = None

    def _reset_step(self) -> None:
        self.step_sq: Tensor | None = None  # [3] sums of squared norms (all, teacher, student)
        self.step_count: Tensor | None = None  # [3] token counts

    # --- the module's logit-gradient sink ---------------------------------------------------------
    def record(self, grad: Tensor, completion_mask: Tensor, teacher_token_mask: Tensor, num_items) -> None:
        """Receive dL/dz `[b, T-1, V]` of one micro-batch, with its masks `[b, T-1]` (already aligned
        with the logits) and the step's `num_items`."""
        if not self.active:
            return
        sq = self.token_sq_norms(grad, num_items)
        comp = completion_mask.bool()
        teacher = comp & teacher_token_mask.bool()
        masks = torch.stack([comp, teacher, comp & ~teacher])  # [3, b, T-1]
        sums = (sq.unsqueeze(0) * masks).flatten(1).sum(-1)
        counts = masks.flatten(1).sum(-1)
        # Kept as device tensors: no host sync per micro-batch.
        self.step_sq = sums if self.step_sq is None else self.step_sq + sums
        self.step_count = counts if self.step_count is None else self.step_count + counts

    @staticmethod
    def token_sq_norms(grad: Tensor, num_items) -> Tensor:
        """‖∂ℓ_t/∂z_t‖² per position `[b, T-1]` from dL/dz with L = Σ ℓ_t / num_items."""
        scale = num_items.float() if isinstance(num_items, Tensor) else float(num_items)
        return (grad.float() * scale).square().sum(-1)

    # --- hooks ------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require(pl_module, LogitGradSource, "GradientStats")
        # Set here, not at train start: a run resumed straight into testing reports its share too.
        self.clip = getattr(getattr(pl_module, "hparams", None), "gradient_clip_val", None) or None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.logit_grad_sink = self

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # Armed for the whole batch when one of its optimiser steps is a multiple of N (a GRPO batch
        # takes `num_iterations` steps; their micro-batches are accumulated into one value).
        self.active = self.interval.due_before(trainer, pl_module)
        self._reset_step()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self.active:
            return
        self.active = False
        metrics = {}
        if self.step_sq is not None:
            # Every rank's tokens (the step's logit gradients are spread over the ranks' rollouts).
            totals = global_sum(torch.cat([self.step_sq.double(), self.step_count.double()]))
            sq, count = totals[:3].tolist(), totals[3:].tolist()
            for i, suffix in enumerate(SPLITS):
                if count[i] > 0:
                    metrics[f"grad/logit_sq_norm{suffix}"] = sq[i] / count[i]
                    self.totals["sq"][i] += sq[i]
                    self.totals["count"][i] += int(count[i])
        step = step_result(outputs)
        if step is not None:
            metrics["grad/param_norm"] = step.grad_norm
            self.totals["param_norm"] += metrics["grad/param_norm"]
            self.totals["steps"] += 1
            self.totals["clipped"] = self.totals.get("clipped", 0) + int(
                self.clip is not None and step.grad_norm > self.clip
            )
        self._reset_step()
        log_scalars(trainer, metrics)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._detach(pl_module)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._detach(pl_module)

    def _detach(self, pl_module) -> None:
        if getattr(pl_module, "logit_grad_sink", None) is self:
            pl_module.logit_grad_sink = None
        self.active = False

    def summary(self) -> dict[str, float]:
        t = self.totals
        out = {
            f"grad/logit_sq_norm{s}": t["sq"][i] / t["count"][i]
            for i, s in enumerate(SPLITS)
            if t["count"][i]
        }
        if t["steps"]:
            out["grad/param_norm"] = t["param_norm"] / t["steps"]
            if self.clip is not None:
                out["grad/clip_share"] = t.get("clipped", 0) / t["steps"]
        return out

    def state_dict(self) -> dict:
        return {"totals": self.totals}

    def load_state_dict(self, state_dict: dict) -> None:
        self.totals = {k: list(v) if isinstance(v, list) else v for k, v in state_dict["totals"].items()}
