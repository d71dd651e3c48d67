"""A distillation step's gradients, apart from Lightning's wiring (`DistillationModule`): both
models' logits over the same columns, and the divergence backpropagated over a rollout batch in
micro-batches, each normalised by the completion tokens of the whole step (across ranks), so that
8 x 1 and 1 x 8 give the same update (TRL issue #4719: a mean per micro-batch mis-weights
completions of different lengths). `StepMeans` is what the step logs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from functools import partial
from typing import TYPE_CHECKING

import torch

from distill.losses import global_sum, gradient_denominator, step_token_count
from distill.models.forward import causal_logits, completion_width
from distill.parallel import gradient_sync

if TYPE_CHECKING:
    from distill.module import DistillationModule


@dataclass
class StepMeans:
    """A distillation step's per-token means over its completion tokens (logged as `train/<name>`):
    the optimised loss and, whatever is optimised, both exact KL directions and both entropies."""

    loss: torch.Tensor
    forward_kl: torch.Tensor
    reverse_kl: torch.Tensor
    student_entropy: torch.Tensor
    teacher_entropy: torch.Tensor


def logit_columns(module: DistillationModule, rollout, rows: slice = slice(None)) -> int | None:
    """K, the last columns of the logits both models compute (`completion_width`: those that
    predict completion tokens), or None for every position. Lean passes use K; so does a
    teacher-only context whatever `lean_logits` says, since the teacher's positions line up
    with the student's only from the right (its prompt has another width)."""
    if module.hparams.lean_logits or rollout.teacher_input_ids is not None:
        return completion_width(rollout.completion_mask[rows, 1:])
    return None


def student_logits(
    module: DistillationModule, rollout, rows: slice = slice(None), keep: int | None = None
) -> torch.Tensor:
    """The student's logits over `rollout`'s rows: the last `keep` positions (None: all)."""
    return causal_logits(
        module.student, rollout.input_ids[rows], rollout.attention_mask[rows], module.vocab_size, keep
    )


def teacher_logits(
    module: DistillationModule, rollout, rows: slice = slice(None), keep: int | None = None
) -> torch.Tensor:
    """The teacher's, read from its own view (`RolloutBatch.teacher_inputs`: with a teacher-only
    context another prompt before the same completion), under no_grad (not inference_mode:
    they meet autograd)."""
    ids, attn = rollout.teacher_inputs()
    with torch.no_grad():
        return causal_logits(module.teacher, ids[rows], attn[rows], module.vocab_size, keep)


def pair_logits(
    module: DistillationModule, rollout, rows: slice = slice(None)
) -> tuple[torch.Tensor, torch.Tensor]:
    """(student, teacher) logits over the same columns (`logit_columns`)."""
    keep = logit_columns(module, rollout, rows)
    return student_logits(module, rollout, rows, keep), teacher_logits(module, rollout, rows, keep)


def accumulate_gradients(module: DistillationModule, rollout) -> tuple[StepMeans, torch.Tensor, dict]:
    """Backpropagate the divergence over `rollout` in micro-batches, each normalised by the
    completion tokens of the whole step (every rank's; under DDP/FSDP by `gradient_denominator`,
    so the ranks' averaged gradient is the single-process one). Returns the step's per-token
    means over every rank's tokens (`StepMeans`), the global token count and wall seconds per
    phase."""
    ids = rollout.input_ids
    mask = rollout.completion_mask[:, 1:]  # aligned with the logits (position t predicts t+1)
    teacher_written = rollout.teacher_token_mask[:, 1:]
    num_items = step_token_count([mask])
    denom = gradient_denominator(num_items)  # num_items / world size
    size = module.hparams.micro_batch_size or ids.shape[0]
    backward = module.manual_backward if module._trainer is not None else torch.Tensor.backward
    timings = {"teacher_forward": 0.0, "student_forward_backward": 0.0}
    sums = torch.zeros(5, device=ids.device)
    starts = range(0, ids.shape[0], size)
    for start in starts:
        rows = slice(start, start + size)
        # Lean: the last K columns only; masks and tokens are cut to the same columns.
        keep = logit_columns(module, rollout, rows)
        cols = slice(-keep if keep else None, None)
        t0 = time.perf_counter()
        teacher = teacher_logits(module, rollout, rows, keep)
        t1 = time.perf_counter()
        student = student_logits(module, rollout, rows, keep)
        if module.logit_grad_sink is not None:
            record = module.logit_grad_sink.record
            student.register_hook(
                partial(
                    record,
                    completion_mask=mask[rows, cols],
                    teacher_token_mask=teacher_written[rows, cols],
                    num_items=denom,
                )
            )
        loss, stats = module.divergence(
            student,
            teacher,
            mask[rows, cols],
            tokens=ids[rows, 1:][:, cols],
            num_items=denom,
            return_statistics=True,
        )
        with gradient_sync(module, last=start == starts[-1]):  # DDP: one all-reduce per step
            backward(loss)
        timings["teacher_forward"] += t1 - t0
        timings["student_forward_backward"] += time.perf_counter() - t1
        m = mask[rows, cols].float()
        keys = [f.name for f in fields(StepMeans)][1:]
        sums += torch.stack([loss.detach() * denom] + [(stats[k] * m).sum() for k in keys])
        del student, teacher, stats
    return StepMeans(*(global_sum(sums) / num_items.clamp(min=1))), num_items, timings
