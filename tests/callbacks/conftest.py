"""Fixtures: a stand-in Trainer and LightningModule for calling callback hooks directly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


class RecordingLogger:
    """Collects `log_metrics` calls as (step, metrics)."""

    def __init__(self):
        self.calls: list[tuple[int, dict]] = []

    def log_metrics(self, metrics: dict, step: int) -> None:
        self.calls.append((step, dict(metrics)))


@pytest.fixture
def fake_trainer(tmp_path):
    """What the callbacks read from a Trainer: global_step, loggers, callback_metrics, run dir."""

    def make(**overrides):
        values = dict(
            global_step=0,
            loggers=[RecordingLogger()],
            callback_metrics={},
            default_root_dir=str(tmp_path),
            datamodule=None,
            sanity_checking=False,
        )
        return SimpleNamespace(**(values | overrides))

    return make


@pytest.fixture
def fake_module(char_tok):
    """A LightningModule stand-in holding a student (what the callbacks use)."""

    def make(student, teacher=None):
        return SimpleNamespace(
            student=student,
            teacher=teacher,
            tokenizer=char_tok,
            vocab_size=len(char_tok),
            device=torch.device("cpu"),
            logit_grad_sink=None,
        )

    return make
