"""Runs that survive: a real `distill fit` subprocess killed with SIGKILL (mid-training, during
testing; alone and inside a sweep) resumes to the metrics of an uninterrupted run; two sweeps of
one output refuse each other; non-finite training ends as `diverged`, in strict JSON."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]


def short_config(where: Path) -> Path:
    """configs/tiny/base.yaml, shortened: a run that still crosses checkpoints (every 2 steps),
    validations (every 3), rollout batches reused across a checkpoint (refresh_every 3: fresh at
    steps 0, 3, 6, 9), fresh ones mid-epoch after it, and an epoch boundary (48 prompts = 8
    batches of 6); its callbacks end with the faults of `inject` (armed by the environment)."""
    base = ROOT / "configs" / "tiny" / "base.yaml"
    callbacks = yaml.safe_load(base.read_text())["trainer"]["callbacks"]
    # Every measurement callback stays (each has state to resume), on a few prompts: at the base's
    # sizes their evaluations are most of a 10-step fit's time.
    smaller = {
        "TaskEvaluation": {"num_problems": 4, "num_samples": 2, "ks": [1, 2]},
        "Forgetting": {"num_examples": 8},
        "StyleProbe": {"num_prompts": 8},
    }
    for callback in callbacks:
        callback.setdefault("init_args", {}).update(
            smaller.get(callback["class_path"].rsplit(".", 1)[-1], {})
        )
    config = {
        "base": str(base),
        "checkpoint_every_n_steps": 2,
        "trainer": {
            "max_steps": 10,
            "val_check_interval": 3,
            "log_every_n_steps": 1,
            "callbacks": [
                *callbacks,
                {"class_path": "inject.KillAt"},
                {"class_path": "inject.PoisonAt"},
                {"class_path": "inject.SignalAt"},
            ],
        },
        "data": {
            "batch_size": 6,
            "train_size": 48,
            "refresh_every": 3,
            "sampling": {"max_new_tokens": 12},
            "evaluation": {
                "val_size": 8,
                "test_size": 8,
                "batch_size": 8,
                "max_new_tokens": 12,
                "test_tasks": ["countdown3"],
            },
        },
    }
    path = where / "short.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


# Wall-clock figures differ between any two runs; everything else must not.
TIMING = ("cost/wall_s", "cost/time/")


# The fits' environment and each early fit's run directory, made once a session: by `early_jobs`
# when this module's tests are selected, else by the first test that asks.
SESSION: dict = {"env": None, "runs": {}}
# After the loggers' fits among the early jobs (tests/conftest.py); its tests resume them in the
# main thread while the vLLM file and the real pipeline run.
EARLY_ORDER = 1


def fits_env(request) -> dict:
    if SESSION["env"] is None:
        quick_world = request.getfixturevalue("quick_world")
        SESSION["env"] = {
            "SHORT": str(short_config(request.getfixturevalue("tmp_path_factory").mktemp("short"))),
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "faults")]),
            "DISTILL_CACHE": str(quick_world.parent),
            "OMP_NUM_THREADS": "1",
        }
    return SESSION["env"]


@pytest.fixture(scope="module")
def shared_env(request) -> dict:
    return fits_env(request)


@pytest.fixture
def env(shared_env) -> dict:
    return dict(shared_env)


def command(run_dir: Path, env: dict, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "distill.cli",
        "fit",
        "--config",
        env["SHORT"],
        "--run_dir",
        str(run_dir),
        *extra,
    ]


def fit(
    cores, run_dir: Path, env: dict, *extra: str, ranks: int = 1, **armed: str
) -> subprocess.CompletedProcess:
    """A `distill fit` of the short config, run now (on `ranks` of the session's cores)."""
    return cores.run(command(run_dir, env, *extra), ranks, cwd=ROOT, env={**env, **armed}, timeout=600)


@pytest.fixture
def refusal(env, monkeypatch, capsys):
    """`refusal(run_dir, *extra)`: the one-line error of a fit that must refuse before any compute,
    run in this process (a refusal needs no subprocess, which would spend ~9 s on imports)."""
    from distill.lightning_cli import run_lightning_cli

    monkeypatch.setenv("DISTILL_CACHE", env["DISTILL_CACHE"])
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "faults"))  # the `inject` callbacks
    monkeypatch.chdir(ROOT)

    def refuse(run_dir: Path, *extra: str) -> str:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_info:
            run_lightning_cli(["fit", "--config", env["SHORT"], "--run_dir", str(run_dir), *extra])
        assert exit_info.value.code == 2
        return capsys.readouterr().err

    return refuse


def untimed(run_dir: Path) -> dict:
    data = json.loads((run_dir / "metrics.json").read_text())
    assert data["status"] == "finished"
    return {k: v for k, v in data["metrics"].items() if not k.startswith(TIMING)}


# Two `gloo` ranks with the student sharded by FSDP2 (`distill.parallel`), 3 prompts each: the
# reference's global batch of 6.
TWO_FSDP_RANKS = [
    "--trainer.devices=2",
    "--trainer.strategy=ModelParallelStrategy",
    "--trainer.strategy.data_parallel_size=2",
    "--trainer.strategy.tensor_parallel_size=1",
    "--trainer.strategy.save_distributed_checkpoint=false",
    "--data.batch_size=3",
]
DIVERGING = ["--data.refresh_every", "1", "--model.init_args.max_nonfinite_steps", "2"]

# The first fit of each test (the one its assertions, or its resume, start from): (arguments,
# environment, ranks). They run ahead, two cores' worth at a time, while the tests resume theirs.
FIRST = {
    "reference": ([], {}, 1),
    "killed_at_5": ([], {"DISTILL_TEST_KILL_AT_STEP": "5"}, 1),
    "sigterm_at_5": ([], {"DISTILL_TEST_SIGNAL_AT_STEP": "5"}, 1),
    "killed_at_9": ([], {"DISTILL_TEST_KILL_AT_STEP": "9"}, 1),
    "killed_in_test": ([], {"DISTILL_TEST_KILL_IN": "test"}, 1),
    "fsdp_killed_at_5": (TWO_FSDP_RANKS, {"DISTILL_TEST_KILL_AT_STEP": "5"}, 2),
    # Rank 1 gets SIGTERM in the validation after step 6 and stays busy 5 s.
    "busy_in_validation": (
        TWO_FSDP_RANKS,
        {
            "DISTILL_TEST_SIGNAL_AT_STEP": "6",
            "DISTILL_TEST_SIGNAL_IN": "validation",
            "DISTILL_TEST_SIGNAL_RANK": "1",
            "DISTILL_TEST_STALL_S": "5",
        },
        2,
    ),
    # Rank 1 gets SIGTERM after step 3 and stays busy 120 s, with a 3 s grace.
    "watchdog": (
        ["--trainer.devices=2", "--trainer.strategy=ddp", "--data.batch_size=3"],
        {
            "DISTILL_STOP_GRACE_S": "3",
            "DISTILL_TEST_SIGNAL_AT_STEP": "3",
            "DISTILL_TEST_SIGNAL_RANK": "1",
            "DISTILL_TEST_STALL_S": "120",
        },
        2,
    ),
    "killed_at_3": ([], {"DISTILL_TEST_KILL_AT_STEP": "3"}, 1),
    # Poisoned after step 5: the checkpoint of step 4 is clean, and no validation (which samples
    # from the student too, and would end the run there) comes before the guard's second skip.
    # On-policy, the next rollouts are sampled from a NaN student; on teacher-written rollouts the
    # loss is NaN, and two skipped steps in a row stop the run.
    **{
        f"nan_mix{mix}": (
            ["--data.mix", str(mix), *DIVERGING, "--trainer.val_check_interval", "10"],
            {"DISTILL_TEST_POISON_AT_STEP": "5"},
            1,
        )
        for mix in (0, 1)
    },
    # The sweep's fit, killed after step 5 (the sweep's own command: `sweep_command`).
    "killed_sweep": ([], {"DISTILL_TEST_KILL_AT_STEP": "5"}, 1),
    # A vanishing divergence temperature makes every gradient norm infinite.
    "infinite_gradients": (
        [
            "--model.init_args.divergence.init_args.temperature",
            "1e-30",
            "--model.init_args.max_nonfinite_steps",
            "3",
            "--checkpoint_every_n_steps",
            "1",
        ],
        {},
        1,
    ),
}
# The first fits each test reads, in the file's order (the order they are started in).
NEEDS = {
    "test_killed_mid_training_resumes_to_the_uninterrupted_metrics": ["reference", "killed_at_5"],
    "test_sigterm_stops_at_the_end_of_that_step_with_a_checkpoint_and_resumes_exactly": [
        "reference",
        "sigterm_at_5",
    ],
    "test_killed_right_after_an_epoch_ends_resumes_into_the_next": ["reference", "killed_at_9"],
    "test_killed_while_testing_resumes_with_its_training_figures": ["reference", "killed_in_test"],
    "test_fsdp_ranks_killed_and_resumed_report_what_one_process_reports": ["reference", "fsdp_killed_at_5"],
    "test_sigterm_to_a_rank_busy_in_validation_stops_both_ranks_at_the_next_step": ["busy_in_validation"],
    "test_a_rank_that_cannot_reach_a_step_end_is_stopped_by_its_watchdog": ["watchdog"],
    "test_moved_run_directory_resumes": ["reference", "killed_at_3"],
    "test_resume_with_a_recorded_config_change": ["killed_at_3"],
    "test_nan_weights_end_the_run_diverged_with_a_clean_checkpoint[mix0]": ["nan_mix0"],
    "test_nan_weights_end_the_run_diverged_with_a_clean_checkpoint[mix1]": ["nan_mix1"],
    "test_infinite_gradients_are_skipped_then_stop_the_run": ["infinite_gradients"],
    "test_sweep_resumes_a_killed_fit_and_refuses_a_second_sweep": ["reference", "killed_sweep"],
}


def sweep_command(where: Path, env: dict) -> list[str]:
    """`distill sweep` of the short config alone, out to `where`/sweep (its spec written there)."""
    spec = where / "spec.yaml"
    fields = {"name": "faults", "out": str(where / "sweep"), "base": env["SHORT"], "references": False}
    spec.write_text(yaml.safe_dump({**fields, "axes": {"seed": [0]}}))
    return [sys.executable, "-m", "distill.cli", "sweep", str(spec)]


def early_jobs(request, selected: set[str]) -> dict:
    """The FIRST fits the selected tests read, for `start_early` (tests/conftest.py) to start at the
    session's start."""
    env, jobs = None, {}
    for test, names in NEEDS.items():
        for name in names if test in selected else ():
            if f"kill_resume/{name}" in jobs:
                continue
            env = env or fits_env(request)
            extra, armed, ranks = FIRST[name]
            where = request.getfixturevalue("tmp_path_factory").mktemp(name)
            run = SESSION["runs"][name] = where if name == "killed_sweep" else where / "run"
            line = sweep_command(where, env) if name == "killed_sweep" else command(run, env, *extra)
            jobs[f"kill_resume/{name}"] = (line, ranks, dict(cwd=ROOT, env={**env, **armed}, timeout=600))
    return jobs


def first(early, name: str) -> tuple[Path, subprocess.CompletedProcess]:
    """A FIRST fit's run directory and process, once it has ended."""
    job = early(f"kill_resume/{name}")
    return SESSION["runs"][name], job.result()


@pytest.fixture(scope="module")
def reference(early) -> dict:
    """The uninterrupted run's figures, fitted once for every test that compares against it."""
    run, done = first(early, "reference")
    assert done.returncode == 0, done.stderr[-2000:]
    return untimed(run)


@pytest.mark.slow
def test_killed_mid_training_resumes_to_the_uninterrupted_metrics(cores, early, env, reference, refusal):
    run, killed = first(early, "killed_at_5")
    assert killed.returncode == -signal.SIGKILL
    assert not (run / "metrics.json").exists()
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 4  # the last checkpoint before the kill
    # Mid-epoch (4 of 8 batches), with the rollout batch sampled at step 3 still to be reused.
    state = ckpt["RolloutDataModule"]
    assert state["position"] == {"epoch": 0, "batches": 4} and state["reuse"]["step"] == 3

    assert "--ckpt_path last" in refusal(run).strip().splitlines()[-1]
    resumed = fit(cores, run, env, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert untimed(run) == reference
    assert "not resumable" not in resumed.stderr  # Lightning's warning, wrong here, is filtered
    assert (
        "ModelCheckpoint with manual optimization" not in resumed.stderr
    )  # also filtered: post-step on purpose
    assert not list((run / "checkpoints").glob("last-v*.ckpt"))
    # TensorBoard holds each step once: what the killed attempt logged after step 4 is purged.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == sorted(set(steps)) and len(steps) == 10, steps


def status(run: Path) -> dict:
    return json.loads((run / "status.json").read_text())


@pytest.mark.slow
def test_sigterm_stops_at_the_end_of_that_step_with_a_checkpoint_and_resumes_exactly(
    cores, early, env, reference
):
    """SIGTERM after step 5 (checkpoints every 2 steps): the fit writes step 5's checkpoint, an
    `interrupted` status record that says so, and exits 143; `--ckpt_path last` ends with every
    figure of the uninterrupted run."""
    run, stopped = first(early, "sigterm_at_5")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-2000:]
    record = status(run)
    assert (record["state"], record["rank"], record["step"]) == ("interrupted", 0, 5)
    assert record["reason"] == "SIGTERM: stopped at the end of step 5 on every rank"
    assert record["resume_from"] == {"path": "checkpoints/last.ckpt", "step": 5}
    assert stopped.stderr.strip().splitlines()[-1] == (
        "distill fit: run interrupted: interrupted at step 5: SIGTERM: stopped at the end of step 5 on "
        "every rank; resumes from checkpoints/last.ckpt (step 5)"
    )
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 5 and not (run / "metrics.json").exists()
    resumed = fit(cores, run, env, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert untimed(run) == reference
    assert status(run)["state"] == "finished"


@pytest.mark.slow
def test_killed_right_after_an_epoch_ends_resumes_into_the_next(cores, early, env, reference):
    """The checkpoint of step 8 closes epoch 0 (8 batches): the resumed run must start epoch 1 at
    its first batch, not replay or skip it."""
    run, killed = first(early, "killed_at_9")
    assert killed.returncode == -signal.SIGKILL
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 8 and ckpt["RolloutDataModule"]["position"] == {"epoch": 0, "batches": 8}
    resumed = fit(cores, run, env, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert untimed(run) == reference


@pytest.mark.slow
def test_killed_while_testing_resumes_with_its_training_figures(cores, early, env, reference):
    run, killed = first(early, "killed_in_test")
    assert killed.returncode == -signal.SIGKILL and not (run / "metrics.json").exists()
    resumed = fit(cores, run, env, "--ckpt_path", "last")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    metrics = untimed(run)
    assert metrics == reference
    assert metrics["cost/flops"] > 0 and "val/countdown3/accuracy" in metrics and "train/loss" in metrics


@pytest.mark.slow
def test_fsdp_ranks_killed_and_resumed_report_what_one_process_reports(cores, early, env, reference):
    """2 FSDP2 ranks, killed after step 5 and resumed from step 4's checkpoint (each rank's reused
    rollout batch restored: `reuse_by_rank`), report every figure of the uninterrupted single
    process to float32 summation order (ranks sum tokens in another order: measured 2e-7
    relative at most; a rank's reused batch restored from the wrong rank gave 4e-3, rank-local
    token counts a factor 2). The exported student is the whole, gathered model."""
    run, killed = first(early, "fsdp_killed_at_5")
    assert killed.returncode == -signal.SIGKILL
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    by_rank = ckpt["RolloutDataModule"]["reuse_by_rank"]
    assert ckpt["global_step"] == 4 and [r["step"] for r in by_rank] == [3, 3]
    assert by_rank[0]["rows"] != by_rank[1]["rows"]  # each rank's own prompts
    resumed = fit(cores, run, env, *TWO_FSDP_RANKS, "--ckpt_path", "last", ranks=2)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    metrics = untimed(run)
    assert metrics.keys() == reference.keys()
    for key, value in reference.items():
        assert metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    from safetensors.torch import load_file

    exported = load_file(run / "student" / "model.safetensors")
    final = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    weights = {k.removeprefix("student."): v for k, v in final["state_dict"].items()}
    assert exported.keys() <= weights.keys() and len(exported) > 10
    for name, tensor in exported.items():
        assert torch.equal(tensor, weights[name]), name


@pytest.mark.slow
def test_sigterm_to_a_rank_busy_in_validation_stops_both_ranks_at_the_next_step(early):
    """Two FSDP ranks; rank 1 gets SIGTERM in the validation after step 6 and stays busy 5 s (a
    compile), while rank 0 runs on into the evaluation's all-reduce. Nothing deadlocks (Lightning's
    own handler, which broadcasts from inside the handler, did): both ranks finish the evaluation
    and step 7, agree there, write step 7's checkpoint and exit."""
    run, stopped = first(early, "busy_in_validation")
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert "distill: rank 1 received SIGTERM; stopping at the end of this step" in stopped.stderr
    record = status(run)
    assert (record["state"], record["step"]) == ("interrupted", 7)
    assert record["resume_from"] == {"path": "checkpoints/last.ckpt", "step": 7}
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 7  # a resume from it: as any (test_fsdp_ranks_killed_and_resumed...)


@pytest.mark.slow
def test_a_rank_that_cannot_reach_a_step_end_is_stopped_by_its_watchdog(early):
    """Rank 1 gets SIGTERM after step 3 and stays busy 120 s; with a 3 s grace every process is
    gone within seconds, and the record names the checkpoint a resume starts from (step 2's)."""
    run, stopped = first(early, "watchdog")
    assert stopped.seconds < 100  # the stall alone would be 120 s (start-up included)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    record = status(run)
    assert record["state"] == "interrupted"
    assert "no step ended within 3 s" in record["reason"], record
    assert record["resume_from"] == {"path": "checkpoints/last.ckpt", "step": 2}


@pytest.fixture(scope="module")
def killed_at_3(early) -> Path:
    """A run killed after step 3, fitted once; each test that resumes it resumes its own copy."""
    run, killed = first(early, "killed_at_3")
    assert killed.returncode == -signal.SIGKILL
    return run


@pytest.mark.slow
def test_moved_run_directory_resumes(cores, tmp_path, env, reference, killed_at_3):
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(killed_at_3, moved)
    # Moved: nothing is left where the run was written, so a path recorded there cannot be read.
    away = killed_at_3.with_name("away")
    killed_at_3.rename(away)
    try:
        resumed = fit(cores, moved, env, "--ckpt_path", "last")
    finally:
        wrote_to_old_path = killed_at_3.exists()
        if wrote_to_old_path:  # cleared, so that the shared run is restored for the next test
            shutil.rmtree(killed_at_3)
        away.rename(killed_at_3)
    assert not wrote_to_old_path, "the moved run's resume wrote where the run used to be"
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert untimed(moved) == reference


@pytest.mark.slow
def test_resume_with_a_recorded_config_change(cores, tmp_path, env, refusal, killed_at_3):
    run = tmp_path / "run"
    shutil.copytree(killed_at_3, run)
    lr = ["--model.init_args.optimizer.init_args.lr", "0.01"]
    base = yaml.safe_load((ROOT / "configs" / "tiny" / "base.yaml").read_text())
    base_lr = base["model"]["init_args"]["optimizer"]["init_args"]["lr"]
    assert base_lr != 0.01
    assert f"model.init_args.optimizer.init_args.lr: {base_lr} -> 0.01" in refusal(
        run, "--ckpt_path", "last", *lr
    )
    resumed = fit(cores, run, env, "--ckpt_path", "last", *lr, "--allow_config_change", "true")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    changes = json.loads((run / "config_changes.json").read_text())
    assert changes[-1]["changes"] == {
        "model.init_args.optimizer.init_args.lr": {"checkpoint": base_lr, "now": 0.01}
    }
    assert (
        yaml.safe_load((run / "config.yaml").read_text())["model"]["init_args"]["optimizer"]["init_args"][
            "lr"
        ]
        == 0.01
    )
    assert untimed(run)["train/lr"] == pytest.approx(
        0.01
    )  # applied, not just recorded (the checkpoint held the base's rate)
    assert "holds a finished run" in refusal(run)


def test_a_run_dir_that_is_a_file_or_cannot_be_written_is_one_line(tmp_path, refusal, monkeypatch):
    taken = tmp_path / "taken"
    taken.write_text("a file\n")
    assert (
        refusal(taken)
        .strip()
        .endswith(f"run_dir {str(taken)!r} is a file, not a directory; give a directory for the run")
    )
    assert taken.read_text() == "a file\n"
    assert "cannot be created" in refusal(taken / "run")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr("distill.rundir.tempfile.TemporaryFile", read_only)
    line = refusal(tmp_path / "run").strip()
    assert line.endswith(
        f"run_dir {str(tmp_path / 'run')!r} cannot be written (in {str(tmp_path)!r}): Read-only file system"
    )


@pytest.mark.slow
@pytest.mark.cores(2)  # a fit in this process, on its two threads
def test_a_full_disk_is_one_line_a_status_record_and_an_intact_checkpoint(tmp_path, env, monkeypatch, capsys):
    """The checkpoint of step 4 cannot be written (ENOSPC): one line that says so and where the run
    stands; step 2's checkpoint is whole, and the run resumes from it."""
    from distill.lightning_cli import run_lightning_cli
    from distill.run_record import AtomicCheckpointIO

    monkeypatch.setenv("DISTILL_CACHE", env["DISTILL_CACHE"])
    monkeypatch.syspath_prepend(str(ROOT / "tests" / "faults"))
    monkeypatch.chdir(ROOT)
    save = AtomicCheckpointIO.save_checkpoint

    def full_after_step_2(self, checkpoint, path, storage_options=None):
        if checkpoint["global_step"] > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", full_after_step_2)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            ["fit", "--config", env["SHORT"], "--run_dir", str(run), "--trainer.max_steps", "5"]
        )
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    assert err[-1] == (
        f"distill fit: error: No space left on device writing {run / 'checkpoints' / 'last.ckpt'}; failed at step 4: "
        f"OSError: [Errno 28] No space left on device: '{run / 'checkpoints' / 'last.ckpt'}'; resumes from "
        "checkpoints/last.ckpt (step 2)"
    )
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 2


def strict_json(path: Path) -> dict:
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")

    return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.slow
@pytest.mark.parametrize(
    "mix, reason",
    [
        (0, "next-token probabilities are not finite"),
        (1, "2 steps in a row had a non-finite loss or gradient norm after optimiser step 5"),
    ],
    ids=["mix0", "mix1"],
)
def test_nan_weights_end_the_run_diverged_with_a_clean_checkpoint(mix, reason, early):
    run, done = first(early, f"nan_mix{mix}")
    assert done.returncode == 3, done.stderr[-2000:]
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"distill fit: run diverged: {strict_json(run / 'metrics.json')['reason']}"
    )
    record = strict_json(run / "metrics.json")
    assert record["status"] == "diverged" and reason in record["reason"]
    assert not (run / "student").exists()
    for name in record.get("nonfinite", []):
        assert record["metrics"][name] is None
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False, map_location="cpu")
    assert ckpt["global_step"] == 4 and all(t.isfinite().all() for t in ckpt["state_dict"].values())

    from distill.experiments.run.records import run_problem

    assert run_problem(run, record) == f"diverged: {record['reason']}"


@pytest.mark.slow
def test_infinite_gradients_are_skipped_then_stop_the_run(early):
    """A vanishing divergence temperature makes every gradient norm infinite: no update is taken
    (the weights stay those of the start) and the run stops after `max_nonfinite_steps`."""
    run, done = first(early, "infinite_gradients")
    assert done.returncode == 3, done.stderr[-2000:]
    record = strict_json(run / "metrics.json")
    assert record["status"] == "diverged"
    assert record["reason"].startswith(
        "3 steps in a row had a non-finite loss or gradient norm after optimiser step 0"
    )
    assert record["metrics"]["train/nonfinite_steps"] == 3.0


@pytest.mark.slow
def test_sweep_resumes_a_killed_fit_and_refuses_a_second_sweep(cores, early, env, reference):
    tmp_path, killed = first(early, "killed_sweep")
    sweep = sweep_command(tmp_path, env)
    assert killed.returncode == 1 and "FAILED" in killed.stdout + killed.stderr
    (run,) = [p for p in (tmp_path / "sweep").iterdir() if (p / "settings.json").exists()]
    assert (run / "checkpoints" / "last.ckpt").is_file() and not (run / "metrics.json").exists()

    # A second sweep of the same output while one runs (its fit a sleeper, so it stays busy).
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)", "fit"]
    holder = subprocess.Popen(
        [*sweep, "--fit-prefix", subprocess.list2cmdline(sleeper)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        lock = tmp_path / "sweep" / ".lock"
        while f"pid {holder.pid} " not in (lock.read_text() if lock.exists() else ""):
            assert holder.poll() is None
            time.sleep(0.05)
        second = subprocess.run(sweep, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert (
            f"sweep output directory {str(tmp_path / 'sweep')!r} is in use by pid {holder.pid}"
            in second.stderr
        )
    finally:
        holder.send_signal(signal.SIGTERM)  # the sweep stops its fit and exits
        holder.wait(timeout=120)

    resumed = cores.run(sweep, cwd=ROOT, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert untimed(run) == reference
