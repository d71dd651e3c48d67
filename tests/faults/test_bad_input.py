"""Hostile but fair input to `distill fit`: each case exits 2 with one line naming the field, the
value and what to do, before any model is loaded, and leaves no run directory behind."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from distill.lightning_cli import run_lightning_cli

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--config", "configs/tiny/base.yaml"]

# (id, extra arguments, a piece of the one-line error)
FLAG_CASES = [
    (
        "default_root_dir",
        ["--trainer.default_root_dir", "elsewhere"],
        "trainer.default_root_dir='elsewhere' is not used: the run directory is --run_dir",
    ),
    ("logger", ["--trainer.logger", "false"], "trainer.logger=False is not used: a run logs to TensorBoard"),
    (
        "trainer_clip",
        ["--trainer.gradient_clip_val", "0.5"],
        "trainer.gradient_clip_val=0.5 is not used: the training step clips the gradient itself; set model.gradient_clip_val instead",
    ),
    (
        "accumulate",
        ["--trainer.accumulate_grad_batches", "4"],
        "trainer.accumulate_grad_batches=4 is not used: one rollout batch (data.batch_size prompts) is one optimiser step; to fit it in memory split it with model.micro_batch_size instead",
    ),
    ("ckpt_missing", ["--ckpt_path", "/nowhere/last.ckpt"], "ckpt_path '/nowhere/last.ckpt' does not exist"),
    ("ckpt_last_absent", ["--ckpt_path", "last"], "has no checkpoint (checkpoints/last.ckpt is missing)"),
    (
        "checkpoint_every",
        ["--checkpoint_every_n_steps", "-1"],
        "checkpoint_every_n_steps must be an integer >= 0, got -1",
    ),
    (
        "lr_negative",
        ["--model.init_args.optimizer.init_args.lr", "-1"],
        "model.optimizer: Invalid learning rate: -1",
    ),
    (
        "betas",
        ["--model.init_args.optimizer.init_args.betas", "[1.5, 0.9]"],
        "model.optimizer: Invalid beta parameter at index 0: 1.5",
    ),
    (
        "guard_patience",
        ["--model.init_args.max_nonfinite_steps", "0"],
        "model.max_nonfinite_steps must be an integer >= 1, got 0",
    ),
    ("mix", ["--data.mix", "1.5"], "data.mix must be in [0, 1], got 1.5"),
    ("batch_size", ["--data.batch_size", "0"], "data.batch_size must be an integer >= 1, got 0"),
    # a case's message is one or more parts that the line holds in this order
    ("granularity", ["--data.granularity", "row"], "data.granularity must be one of"),
    (
        "temperature",
        ["--data.sampling.temperature", "-1"],
        "data.sampling.temperature must be a finite number >= 0 (0 = greedy), got -1",
    ),
    (
        "student_path",
        ["--model.init_args.student", "/nowhere/student"],
        "model.student: no model directory at '/nowhere/student'",
    ),
    (
        "micro_batch",
        ["--model.init_args.micro_batch_size", "0"],
        "model.micro_batch_size must be None or an integer >= 1, got 0",
    ),
    # a class path that does not import, a value Lightning's Trainer refuses
    (
        "divergence_class_path",
        ["--model.init_args.divergence.class_path", "distill.losses.NoSuchKL"],
        "model.init_args.divergence must be a subclass of TokenDivergence, one of: "
        "distill.losses.ForwardKL, distill.losses.ReverseKL, distill.losses.GeneralizedJSD, "
        "distill.losses.SkewKL, distill.losses.SkewReverseKL, distill.losses.TotalVariation, "
        "distill.losses.InterpolatedKL",
        # further subclasses imported by then follow the project's own (a test module's Hellinger)
        "; got 'distill.losses.NoSuchKL'",
    ),
    (
        "max_steps",
        ["--trainer.max_steps", "-5"],
        "trainer.max_steps: `max_steps` must be a non-negative integer or -1 (infinite steps). "
        "You passed in -5.",
    ),
    (
        "val_check_interval",
        ["--trainer.val_check_interval", "-1"],
        "trainer.val_check_interval: You have passed invalid value -1 for val_check_interval",
    ),
]


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if any model is loaded (patched where the modules call it, not only where it
    is defined: `distill.module` imported the name before this patch)."""
    import distill.models.loading as loading
    import distill.module as module
    import distill.rl.module as rl_module

    def refuse(*args, **kwargs):
        pytest.fail("a model was loaded")

    for owner in (loading, module, rl_module):
        monkeypatch.setattr(owner, "load_model", refuse)


def _refused(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(["fit", *args])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "extra, message", [(c[1], c[2:]) for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES]
)
def test_bad_flag_fails_in_one_line_before_any_model_or_run_dir(
    extra, message, tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    line = _refused([*BASE, *extra, "--run_dir", str(run)], capsys)
    at = 0
    for part in message:
        assert part in line[at:], line
        at = line.index(part, at) + len(part)
    assert not run.exists()


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--data.group_size", "1"], "data.group_size must be >= 2 for GRPO"),
        (["--data.sampling.temperature", "0"], "data.sampling.temperature must be > 0 for GRPO"),
    ],
    ids=["group_size", "greedy"],
)
def test_grpo_sampling_that_gives_no_signal_fails_before_any_model(
    extra, message, tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    line = _refused(["--config", "configs/tiny/grpo_countdown.yaml", *extra, "--run_dir", str(run)], capsys)
    assert message in line, line
    assert not run.exists()


def test_yaml_syntax_error_names_file_line_and_column(tmp_path, capsys, no_model_loads):
    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  mix: [0.5\n")
    line = _refused(["--config", str(bad), "--run_dir", str(tmp_path / "run")], capsys)
    assert f"config {bad} is not valid YAML: line 3, column 1: expected" in line, line


def test_missing_base_names_the_file(tmp_path, capsys, no_model_loads):
    child = tmp_path / "child.yaml"
    child.write_text("base: nowhere.yaml\n")
    line = _refused(["--config", str(child)], capsys)
    assert f"config {child}: base 'nowhere.yaml' not found" in line, line


def test_corrupt_weights_name_the_model_before_loading(
    tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    import shutil

    broken = tmp_path / "student"
    shutil.copytree(tiny_world_cache / "student", broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    monkeypatch.chdir(ROOT)
    line = _refused(
        [*BASE, "--model.init_args.student", str(broken), "--run_dir", str(tmp_path / "r")], capsys
    )
    assert (
        line.startswith("distill fit: error: model.student: weight file") and "corrupt or truncated" in line
    ), line


@pytest.mark.parametrize(
    "content, message",
    [
        (b"not a checkpoint at all", "is not a readable checkpoint"),
        ("torch", "is not a Lightning checkpoint (no state_dict)"),
    ],
    ids=["garbage", "not_lightning"],
)
def test_unreadable_checkpoint_is_refused_before_loading(
    content, message, tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    ckpt = tmp_path / "x.ckpt"
    if content == "torch":
        torch.save({"weights": torch.zeros(2)}, ckpt)
    else:
        ckpt.write_bytes(content)
    monkeypatch.chdir(ROOT)
    line = _refused([*BASE, "--ckpt_path", str(ckpt), "--run_dir", str(tmp_path / "r")], capsys)
    assert f"ckpt_path {str(ckpt)!r} {message}" in line, line


def _run_dir_with(tmp_path: Path, status: str | None = None, checkpoint: bool = False) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed_everything: 0\n")
    if status:
        (run / "metrics.json").write_text(json.dumps({"status": status, "metrics": {"a": 1.0}}))
    if checkpoint:
        (run / "checkpoints").mkdir()
        torch.save({"state_dict": {}}, run / "checkpoints" / "last.ckpt")
    return run


@pytest.mark.parametrize("status", ["finished", "diverged"])
def test_a_done_run_is_never_overwritten_without_overwrite(
    status, tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    run = _run_dir_with(tmp_path, status=status)
    monkeypatch.chdir(ROOT)
    for extra in ([], ["--ckpt_path", "last"]):  # neither restarted nor continued
        if extra:
            (run / "checkpoints").mkdir()
            torch.save({"state_dict": {}}, run / "checkpoints" / "last.ckpt")
        line = _refused([*BASE, "--run_dir", str(run), *extra], capsys)
        assert f"run directory {str(run)!r} holds a {status} run (metrics.json); pass --overwrite" in line
    assert json.loads((run / "metrics.json").read_text())["status"] == status  # untouched


def test_a_checkpointed_run_is_resumed_not_restarted(
    tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    run = _run_dir_with(tmp_path, checkpoint=True)
    monkeypatch.chdir(ROOT)
    line = _refused([*BASE, "--run_dir", str(run)], capsys)
    assert "has a checkpoint of an unfinished run: resume it with --ckpt_path last" in line
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_a_changed_config_on_resume_is_refused(
    tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    import yaml

    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        run_lightning_cli(["fit", *BASE, "--print_config"])
    config = yaml.safe_load(capsys.readouterr().out)
    ckpt = tmp_path / "old.ckpt"
    torch.save({"state_dict": {}, "distill_run": {"config": config, "metrics": {}}}, ckpt)
    line = _refused(
        [
            *BASE,
            "--ckpt_path",
            str(ckpt),
            "--model.init_args.optimizer.init_args.lr",
            "0.01",
            "--run_dir",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert "the config differs from checkpoint" in line
    base_lr = config["model"]["init_args"]["optimizer"]["init_args"]["lr"]
    assert (
        f"model.init_args.optimizer.init_args.lr: {base_lr} -> 0.01" in line
        and "--allow_config_change" in line
    )


def test_a_changed_schedule_is_refused_even_when_changes_are_allowed(
    tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    import yaml

    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit):
        run_lightning_cli(["fit", *BASE, "--print_config"])
    ckpt = tmp_path / "old.ckpt"
    config = yaml.safe_load(capsys.readouterr().out)
    torch.save({"state_dict": {}, "distill_run": {"config": config, "metrics": {}}}, ckpt)
    line = _refused(
        [
            *BASE,
            "--ckpt_path",
            str(ckpt),
            "--allow_config_change",
            "true",
            "--run_dir",
            str(tmp_path / "r"),
            "--model.init_args.lr_scheduler",
            "torch.optim.lr_scheduler.ConstantLR",
        ],
        capsys,
    )
    assert (
        line.startswith("distill fit: error: model.init_args.lr_scheduler") and "start a new run" in line
    ), line


def test_a_locked_run_dir_refuses_a_second_fit(
    tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads, hold_lock
):
    run = tmp_path / "run"
    holder = hold_lock(run)
    monkeypatch.chdir(ROOT)
    line = _refused([*BASE, "--run_dir", str(run)], capsys)
    assert f"run directory {str(run)!r} is in use by pid {holder.pid}" in line, line
    assert not (run / "config.yaml").exists()


def test_default_run_dirs_do_not_collide(monkeypatch):
    from distill import rundir

    monkeypatch.delenv(rundir.DEFAULT_RUN_DIR_ENV, raising=False)
    names = {rundir.default_run_dir() for _ in range(50)}
    assert len(names) == 50 and all(n.startswith("runs/") for n in names)
    assert time.strftime("%Y%m%d") in next(iter(names))
