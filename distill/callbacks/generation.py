"""What the measurement callbacks do with the student: roll it out (or the teacher) on task rows, and run one
forward pass for its next-token logits; under data parallelism, split a measurement's rows over
the ranks and add their sums up (`rank_share`, `summed_over_ranks`). Works with any LightningModule holding `student`,
`tokenizer` and `vocab_size` (and optionally `teacher`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from distill.data.prompts import PromptCollator
from distill.losses import global_sum
from distill.models.forward import causal_logits, eval_no_grad
from distill.precision import step_precision
from distill.rollout import RolloutBatch, RolloutSampler


def prompt_collator(trainer, pl_module):
    """The datamodule's collator (so chat templates apply as in training), else plain prompts."""
    datamodule = getattr(trainer, "datamodule", None)
    collate = getattr(datamodule, "collate", None)
    return collate if collate is not None else PromptCollator(pl_module.tokenizer, chat_template=False)


def evaluation_settings(trainer):
    """The datamodule's `Evaluation` settings (`data.evaluation`), or None without one."""
    return getattr(getattr(trainer, "datamodule", None), "evaluation", None)


def eval_budget(trainer, task: str, default: int = 128) -> int:
    """The datamodule's greedy evaluation budget for `task` (`data.evaluation.max_new_tokens`, one
    for all tasks or one per task), or `default` without a datamodule that has one."""
    datamodule = getattr(trainer, "datamodule", None)
    if hasattr(datamodule, "eval_budget"):
        return datamodule.eval_budget(task)
    value = getattr(evaluation_settings(trainer), "max_new_tokens", default)
    return value if isinstance(value, int) else max(value.values())


def student_rollouts(
    trainer,
    pl_module,
    rows: list[dict],
    sampler: RolloutSampler,
    batch_size: int,
    seed: int | None = None,
) -> list[RolloutBatch]:
    """Roll out the student alone on `rows` (`sampler.mix` must be 0), `batch_size` rows at a time.

    With a `seed`, each row's sample depends only on (seed, its prompt, how many identical prompts
    precede it in its batch, the settings), so repeated evaluations draw the same random numbers.
    """
    return _rollouts(trainer, pl_module, rows, sampler, batch_size, seed, "student")


def teacher_rollouts(
    trainer,
    pl_module,
    rows: list[dict],
    sampler: RolloutSampler,
    batch_size: int,
    seed: int | None = None,
) -> list[RolloutBatch]:
    """Roll out the teacher alone on `rows` (`sampler.mix` must be 1), reading its own prompt view
    (the teacher-only context, when the datamodule has one) as in training."""
    return _rollouts(trainer, pl_module, rows, sampler, batch_size, seed, "teacher")


def _rollouts(trainer, pl_module, rows, sampler, batch_size, seed, writer: str) -> list[RolloutBatch]:
    mix = 0 if writer == "student" else 1
    if sampler.mix != mix:
        raise ValueError(f"{writer}_rollouts needs a sampler with mix={mix}, got mix={sampler.mix}")
    collate = prompt_collator(trainer, pl_module)
    # The student's prompt alone (no teacher-only context), or both views for the teacher.
    encode = collate.student if writer == "student" else collate
    sampler.use_tokenizer(pl_module.tokenizer)  # its real vocabulary and fallback EOS/pad ids
    student = pl_module.student
    # With mix=0 the teacher writes nothing; the sampler only reads its special ids and logit width.
    teacher = getattr(pl_module, "teacher", None) or student
    out = []
    for start in range(0, len(rows), batch_size):
        enc = encode(rows[start : start + batch_size])
        views = {k: v.to(pl_module.device) for k, v in enc.items() if isinstance(v, torch.Tensor)}
        with step_precision(trainer):  # the trained policy's precision (`distill.precision`)
            out.append(
                sampler.sample(
                    student,
                    teacher,
                    views["input_ids"],
                    views["attention_mask"],
                    seed=seed,
                    teacher_input_ids=views.get("teacher_input_ids"),
                    teacher_attention_mask=views.get("teacher_attention_mask"),
                )
            )
    return out


def next_token_logits(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    vocab_size: int,
    keep: int | None = None,
    trainer=None,
) -> Tensor:
    """Logits `[B, T-1, vocab_size]` predicting tokens 1..T-1 (with `keep` = K: the last K only,
    see `distill.models.forward.causal_logits`), in eval mode without gradients (positions counted
    from each row's first real token, as in training), under `trainer`'s step precision."""
    with eval_no_grad(model), step_precision(trainer):
        return causal_logits(model, input_ids, attention_mask, vocab_size, keep)


def rank_share(items: Sequence) -> list:
    """This rank's share of a measurement's `items` under data parallelism: every W-th item from
    the rank's index (W ranks in the default process group), so the ranks together take each item
    once and each rolls out 1/W of them; every item in one process. Add the shares' sums up with
    `summed_over_ranks`."""
    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    return list(items[rank::world])


def summed_over_ranks(values: Sequence[float], device) -> list[float]:
    """Each rank's `values` (sums over its `rank_share`) added over the ranks: a collective, which
    every rank calls in the same order, on `device` (NCCL reduces GPU tensors only), in float64
    (counts stay exact). The values themselves in one process."""
    return global_sum(torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)).tolist()


def log_scalars(trainer, metrics: dict[str, float], step: int | None = None) -> None:
    """Write scalars to every logger at `step` (default: the global step) and into
    `trainer.callback_metrics`.

    Used from hooks where `LightningModule.log` is refused (`on_train_start`, `on_train_end`) and
    from training hooks, where `log` would only reach the logger on `log_every_n_steps` boundaries
    and so could drop a measurement taken every N steps.
    """
    if not metrics:
        return
    step = trainer.global_step if step is None else step
    for logger in trainer.loggers:
        logger.log_metrics(dict(metrics), step=step)
    trainer.callback_metrics.update({k: torch.tensor(float(v)) for k, v in metrics.items()})
