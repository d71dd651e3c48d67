"""`data.evaluation.max_new_tokens` per task: each evaluated task decodes with its own greedy budget (the
datamodule's test rollouts and `TaskEvaluation`'s samples), and a mapping that leaves out an
evaluated task fails when the datamodule is made, naming the task."""

from __future__ import annotations

import lightning as L
import pytest

from distill.callbacks import TaskEvaluation
from distill.callbacks.generation import eval_budget
from distill.data import RolloutDataModule
from distill.losses import ForwardKL
from distill.module import DistillationModule

BUDGETS = {"countdown3": 3, "countdown4": 7}


class _Widths(L.Callback):
    """The completion width of every test batch's rollout, by task."""

    def __init__(self):
        self.widths: dict[str, set[int]] = {}

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        width = int(batch["rollout"].completion_mask.sum(1).max())
        self.widths.setdefault(batch["task"], set()).add(width)


class _SampledWidths(TaskEvaluation):
    """TaskEvaluation that records the budget of the sampler each task was evaluated with."""

    def evaluate(self, trainer, pl_module, task, rows, sampler, batch_size):
        self.budgets = {**getattr(self, "budgets", {}), task.name: sampler.max_new_tokens}
        return super().evaluate(trainer, pl_module, task, rows, sampler, batch_size)


def test_each_task_decodes_with_its_own_budget(quick_world, tmp_path):
    module = DistillationModule(
        student=str(quick_world / "student"), teacher=str(quick_world / "teacher"), divergence=ForwardKL()
    )
    data = RolloutDataModule(
        task="countdown3", batch_size=2, train_size=4, evaluation={"test_size": 4, "batch_size": 4, "test_tasks": ["countdown3", "countdown4"], "max_new_tokens": BUDGETS},
    )  # fmt: skip
    widths, sampled = _Widths(), _SampledWidths(num_problems=2, num_samples=2, ks=[1, 2])
    trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[widths, sampled],
    )  # fmt: skip
    trainer.test(module, data, verbose=False)
    # The quick world's random models never stop early: every row runs to its task's budget.
    assert widths.widths == {"countdown3": {3}, "countdown4": {7}}
    assert sampled.budgets == BUDGETS
    assert eval_budget(trainer, "countdown4") == 7
    assert eval_budget(trainer, "addition") == 7  # a task the mapping does not name: the largest


def test_one_budget_serves_every_task():
    data = RolloutDataModule(evaluation={"test_tasks": ["countdown3", "countdown4"], "max_new_tokens": 11})
    assert data.eval_budget("countdown4") == data.eval_budget("countdown3") == 11


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"countdown3": 96}, r"no budget for the evaluated task\(s\) \['countdown4'\]"),
        ({"countdown3": 96, "countdown4": 0}, r"data\.evaluation\.max_new_tokens\.countdown4 .*0"),
        ({}, "non-empty"),
        ("96", r"data\.evaluation\.max_new_tokens"),
    ],
)
def test_a_bad_budget_fails_when_the_datamodule_is_made(value, message):
    with pytest.raises(ValueError, match=message):
        RolloutDataModule(evaluation={"test_tasks": ["countdown3", "countdown4"], "max_new_tokens": value})
