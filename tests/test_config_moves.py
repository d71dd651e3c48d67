"""Settings that moved into groups (`distill.config_bases.MOVED`): an old spelling, in a config file
or a flag, is read at its new place with one line naming it; the table matches the classes; the
committed configs use the new spelling only; an archived run's config resolves to its values."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

from distill.config_bases import MOVED, expand_bases, moved_args, moved_config, moved_key
from distill.data import RolloutDataModule
from distill.lightning_cli import run_lightning_cli
from distill.module import DistillationModule
from distill.rl import GRPOModule

ROOT = Path(__file__).resolve().parents[1]
ARCHIVED = ROOT / "experiments/results/v3_grid/divergence=forward_kl,lr=1e-4,mix=0,seed=0/config.yaml"


@pytest.mark.parametrize(("section", "old"), sorted(MOVED))
def test_each_move_lands_on_a_field_of_a_group_the_classes_take(section, old):
    group, field = MOVED[section, old].split(".")
    classes = [RolloutDataModule] if section == "data" else [DistillationModule, GRPOModule]
    owners = [c for c in classes if group in inspect.signature(c).parameters]
    assert owners, f"no {section} class takes {group!r}"
    for cls in owners:
        default = inspect.signature(cls).parameters[group].default
        assert dataclasses.is_dataclass(default) and field in {f.name for f in dataclasses.fields(default)}
        assert old not in inspect.signature(cls).parameters  # moved, not duplicated


def test_flags_move_and_others_stay(capsys):
    args = ["--data.eval_batch_size", "8", "--model.init_args.compile_decoding=false", "--data.mix", "0.5"]
    assert moved_args([*args, "--config", "x.yaml", "--data.evaluation.batch_size=3"]) == [
        "--data.evaluation.batch_size",
        "8",
        "--model.init_args.execution.compile_decoding=false",
        "--data.mix",
        "0.5",
        "--config",
        "x.yaml",
        "--data.evaluation.batch_size=3",
    ]
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "data.eval_batch_size is now data.evaluation.batch_size" in err
    assert moved_key("model.kl_coef", quiet=True) == "model.objective.kl_coef"
    assert moved_key("data.sampling.temperature", quiet=True) == "data.sampling.temperature"


def test_a_config_moves_under_model_init_args_and_data_and_the_new_spelling_wins():
    old = {
        "model": {"init_args": {"student": "s", "log_text_every": 3, "lean_logits": False}, "kl_coef": 0.1},
        "data": {"mix": 0.5, "test_size": 9, "evaluation": {"test_size": 4}, "teacher_context": "c"},
        "trainer": {"max_steps": 2},
    }
    new, moves = moved_config(old)
    assert new == {
        "model": {
            "init_args": {"student": "s", "text_log": {"every": 3}, "execution": {"lean_logits": False}},
            "objective": {"kl_coef": 0.1},
        },
        "data": {"mix": 0.5, "evaluation": {"test_size": 4}, "prompts": {"teacher_context": "c"}},
        "trainer": {"max_steps": 2},
    }
    assert ("data.test_size", "data.evaluation.test_size") in moves and len(moves) == 5
    assert old["data"]["test_size"] == 9  # the caller's mapping is left as it was
    assert moved_config(new) == (new, [])


def test_the_committed_configs_use_the_new_spelling():
    files = sorted((ROOT / "configs").rglob("*.yaml")) + sorted((ROOT / "docs" / "examples").glob("*.yaml"))
    assert files
    stale = {str(f.relative_to(ROOT)): moves for f in files if (moves := moved_config(yaml.safe_load(f.read_text()))[1])}
    assert stale == {}


def test_an_archived_run_config_resolves_to_its_values(capsys):
    """A v3 grid run's config.yaml, written before the move, still parses; every moved value lands
    at its new place, and stderr names the moves in one line."""
    archived = yaml.safe_load(ARCHIVED.read_text())
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", "--config", str(ARCHIVED), "--print_config"])
    assert exit_info.value.code in (0, None)
    captured = capsys.readouterr()
    printed = yaml.safe_load(captured.out)
    assert captured.err.count("settings moved") == 1 and str(ARCHIVED) in captured.err
    for (section, old), place in MOVED.items():
        block = archived[section].get("init_args", archived[section]) if section == "model" else archived[section]
        if old not in block:
            continue
        group, field = place.split(".")
        now = printed[section]["init_args"] if section == "model" else printed[section]
        assert now[group][field] == block[old], (section, old)


def test_a_moved_flag_after_a_base_include_still_wins(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("data:\n  evaluation:\n    batch_size: 5\n")
    (tmp_path / "run.yaml").write_text("base: base.yaml\ndata:\n  eval_batch_size: 7\n")
    args = expand_bases(moved_args(["--config", str(tmp_path / "run.yaml")]))
    assert yaml.safe_load(args[-1]) == {"data": {"evaluation": {"batch_size": 7}}}
    assert "data.eval_batch_size is now data.evaluation.batch_size" in capsys.readouterr().err
