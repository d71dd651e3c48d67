"""Bad input to `distill fit` ends in one line naming the field, the value and what is allowed
(distill.config_errors). More cases, each before any model or run directory, are
in tests/faults/test_bad_input.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from distill.lightning_cli import run_lightning_cli
from distill.names import DIVERGENCE_CLASSES

ROOT = Path(__file__).resolve().parents[1]
BASE = ["fit", "--config", "configs/tiny/base.yaml"]


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["--model.init_args.divergence.class_path", "distill.losses.NoSuchKL"],
            "distill fit: error: model.init_args.divergence must be a subclass of TokenDivergence, one of: "
            + ", ".join(DIVERGENCE_CLASSES.values())
            + "; got 'distill.losses.NoSuchKL' (module 'distill.losses' has no attribute 'NoSuchKL')",
        ),
        (
            ["--trainer.max_steps", "-5"],
            "distill fit: error: trainer.max_steps: `max_steps` must be a non-negative integer or -1 "
            "(infinite steps). You passed in -5.",
        ),
    ],
    ids=["divergence_class_path", "max_steps"],
)
def test_two_refused_commands_print_one_line(extra, expected, quick_world, tmp_path):
    """As a user runs them (a subprocess): stderr is the one line, stdout is empty, exit code 2."""
    done = subprocess.run(
        [sys.executable, "-m", "distill.cli", *BASE, *extra, "--run_dir", str(tmp_path / "run")],
        cwd=ROOT,
        env={**os.environ, "DISTILL_CACHE": str(quick_world.parent), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [expected]
    assert not (tmp_path / "run").exists()


# Refused while parsing: no model, no tiny world needed.
@pytest.mark.parametrize(
    "extra, expected",
    [
        (  # a class name alone must be one jsonargparse can resolve
            ["--model.init_args.divergence", "NoSuchKL"],
            "model.init_args.divergence must be a subclass of TokenDivergence, one of: "
            "distill.losses.ForwardKL, ",
        ),
        (
            ["--model.init_args.divergence", "torch.nn.Linear"],
            "got 'torch.nn.Linear' (Import path torch.nn.Linear does not correspond to a subclass of "
            "TokenDivergence)",
        ),
        (
            ["--model", "distill.module.NoModule"],
            [
                "model must be a subclass of LightningModule, one of: ",
                "distill.module.DistillationModule, ",
                "distill.rl.GRPOModule",
                "; got 'distill.module.NoModule'",
            ],
        ),
        (  # the project's callbacks are listed first
            ["--trainer.callbacks+", "distill.callbacks.NoSuch"],
            "trainer.callbacks must be a subclass of Callback, one of: distill.",
        ),
        (
            ["--model.init_args.optimizer", "torch.optim.NoOpt"],
            "model.init_args.optimizer must be a subclass of Optimizer, one of: ",
        ),
        (
            ["--model.init_args.divergence.init_args.nope", "1"],
            "model.init_args.divergence.init_args.nope: distill.losses.ForwardKL has no option 'nope'; "
            "it takes: temperature, estimator, ",
        ),
        (
            ["--model.init_args.divergence.init_args.temperature", "warm"],
            "model.init_args.divergence.init_args.temperature must be of type float, got 'warm'",
        ),
        (
            ["--trainer.precision", "7"],
            "trainer.precision must be one of [64, 32, 16, 'transformer-engine', ",
        ),
        (["--data.mixx", "0.5"], "unrecognized arguments: --data.mixx 0.5 (did you mean --data.mix?)"),
        (["--seed_everything", "abc"], "seed_everything must be of type int, got 'abc'"),  # a union
    ],
    ids=[
        "short_name",
        "not_a_subclass",
        "model",
        "callback",
        "optimizer",
        "option",
        "type",
        "literal",
        "key",
        "union",
    ],
)
def test_a_refused_value_is_one_line_naming_field_value_and_allowed(extra, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli([*BASE, *extra])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("distill fit: error: "), err
    for piece in [expected] if isinstance(expected, str) else expected:
        assert piece in err[0], err
