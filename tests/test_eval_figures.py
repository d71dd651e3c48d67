"""Validation/test figures are ratios of sums over the whole epoch (torchmetrics), not means of
per-batch means: checked through a real `Trainer.validate` with batches of unequal sizes."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from distill.training import EvalFigures, RatioOfSums

# (correct rows, rows, summed token KL, tokens) per validation batch
BATCHES = [(3.0, 4, 2.0, 10.0), (0.0, 1, 9.0, 2.0), (5.0, 8, 1.0, 30.0)]


class _Scorer(EvalFigures, L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def val_dataloader(self):
        return torch.utils.data.DataLoader(torch.tensor(BATCHES), batch_size=1)

    def test_dataloader(self):
        return torch.utils.data.DataLoader(torch.tensor(BATCHES[:1]), batch_size=1)

    def _evaluate(self, batch, prefix):
        correct, rows, kl, tokens = batch[0]
        self.eval_figure(f"{prefix}/task/accuracy", correct, rows)
        self.eval_figure(f"{prefix}/task/forward_kl", kl, tokens)


def _trainer(tmp_path):
    return L.Trainer(
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path
    )


def _validate(module, tmp_path):
    return _trainer(tmp_path).validate(module, verbose=False)[0]


def test_figures_are_ratios_of_sums_over_the_epoch(tmp_path):
    module = _Scorer()
    first = _validate(module, tmp_path)
    assert first["val/task/accuracy"] == pytest.approx(8 / 13)  # the mean of batch means is 0.458
    assert first["val/task/forward_kl"] == pytest.approx(12 / 42)  # per token, not per batch
    # dropped after logging: a second epoch reports the same, not the sum of both
    assert _validate(module, tmp_path) == pytest.approx(first)
    assert not any("eval_figures" in k or "numerator" in k for k in module.state_dict())


def test_a_stage_logs_only_its_own_figures(tmp_path):
    module, trainer = _Scorer(), _trainer(tmp_path)
    trainer.validate(module, verbose=False)
    tested = trainer.test(module, verbose=False)[0]
    assert tested == pytest.approx({"test/task/accuracy": 3 / 4, "test/task/forward_kl": 2 / 10})


def test_ratio_of_sums_is_zero_when_nothing_was_counted():
    metric = RatioOfSums()
    with pytest.warns(UserWarning, match="called before the ``update``"):
        assert float(metric.compute()) == 0.0
    metric.update(torch.tensor(3.0), torch.tensor(4.0))
    metric.update(torch.tensor(float("nan")), torch.tensor(1.0))  # a diverged figure stays visible
    assert torch.isnan(metric.compute())


def test_the_chance_level_is_that_of_the_rows_evaluated(tmp_path, monkeypatch):
    """Four-option and two-option rows and a free-form one: the logged chance is their mean over
    the rows evaluated, not the task's over all its items."""
    from distill.tasks import registry

    class MixedChoice:
        name = "mixed_choice_test"
        chance = 0.99  # the whole dataset's figure: must not be what is logged

    rows = [{"options": ["a", "b", "c", "d"]}, {"options": ["a", "b"]}, {"options": []}]

    class _Guesser(_Scorer):
        def _evaluate(self, batch, prefix):
            self.chance_figure(prefix, MixedChoice.name, rows, batch.device)

    monkeypatch.setitem(registry.TASKS, MixedChoice.name, MixedChoice())
    logged = _validate(_Guesser(), tmp_path)
    assert logged["val/mixed_choice_test/chance"] == pytest.approx((1 / 4 + 1 / 2 + 0) / 3)
