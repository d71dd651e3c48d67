"""The callbacks' contract with the module they measure: both modules satisfy it, and a module
that lacks something fails in `setup` (before any step) naming what it lacks."""

from __future__ import annotations

from types import SimpleNamespace

import lightning as L
import pytest
import torch

from distill.callbacks import Forgetting, GradientStats, StyleProbe, TaskEvaluation, UpdateSparsity
from distill.callbacks.contract import LogitGradSource, StudentHolder
from distill.module import DistillationModule
from distill.rl import GRPOModule

STUDENT_CALLBACKS = [TaskEvaluation, Forgetting, StyleProbe, UpdateSparsity]


def test_both_modules_satisfy_every_protocol(quick_world):
    student, teacher = str(quick_world / "student"), str(quick_world / "teacher")
    for module in (DistillationModule(student, teacher), GRPOModule(student)):
        assert isinstance(module, StudentHolder) and isinstance(module, LogitGradSource)
        for callback in (*(cls() for cls in STUDENT_CALLBACKS), GradientStats()):
            callback.setup(None, module, "fit")  # raises if the contract is broken


@pytest.mark.parametrize("cls", STUDENT_CALLBACKS)
def test_a_module_without_the_student_contract_is_refused_by_name(cls, fake_module, tiny_student):
    module = fake_module(tiny_student)
    del module.vocab_size
    with pytest.raises(TypeError, match=rf"{cls.__name__} needs .*StudentHolder.*lacks `vocab_size`$"):
        cls().setup(None, module, "fit")


def test_gradient_stats_names_the_missing_sink():
    with pytest.raises(
        TypeError, match=r"GradientStats needs .*`logit_grad_sink`.*SimpleNamespace lacks `logit_grad_sink`"
    ):
        GradientStats().setup(None, SimpleNamespace(student=None), "fit")


class _Bare(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.stepped = 0

    def training_step(self, batch, batch_idx):
        self.stepped += 1
        return self.layer(batch).sum()

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.randn(4, 2), batch_size=2)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_fit_with_an_unfit_module_stops_before_the_first_step(tmp_path):
    module = _Bare()
    trainer = L.Trainer(
        max_steps=2,
        callbacks=[UpdateSparsity()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    with pytest.raises(TypeError, match="UpdateSparsity needs .*lacks `student`, `tokenizer`, `vocab_size`"):
        trainer.fit(module)
    assert module.stepped == 0
