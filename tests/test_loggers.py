"""Further loggers beside TensorBoard (`trainer.logger`, distill.loggers): each gets what TensorBoard
and metrics.json get; a killed and resumed run continues each logger's run without a step twice;
a logger that cannot be built or opened ends the fit in one line before any compute."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CSV = "lightning.pytorch.loggers.CSVLogger"
MLFLOW = "lightning.pytorch.loggers.MLFlowLogger"


def loggers_config(where: Path) -> list[dict]:
    return [
        {"class_path": CSV, "init_args": {"save_dir": str(where / "csv"), "name": "run"}},
        {
            "class_path": MLFLOW,
            "init_args": {"tracking_uri": f"file:{where / 'mlruns'}", "experiment_name": "distill"},
        },
    ]


# --- what each logger holds -------------------------------------------------------------------------
def tensorboard_curves(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()  # reads a resumed run as TensorBoard shows it (what a resume purged is gone)
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def tensorboard_hparams(run: Path) -> dict:
    """What TensorBoard holds of the hyperparameters: the modules' (hparams.yaml, at the start) and
    the run's knobs (the HParams dashboard's, at the end)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    start = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    knobs = plugin_data_pb2.HParamsPluginData.FromString(start).session_start_info.hparams
    hparams = yaml.safe_load((run / "tensorboard" / "hparams.yaml").read_text())
    for name, value in knobs.items():
        hparams[name] = getattr(value, value.WhichOneof("kind"))
    return hparams


def csv_curves(where: Path) -> dict[str, list[tuple[int, float]]]:
    (path,) = (where / "csv").rglob("metrics.csv")
    curves = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            for name, value in row.items():
                if name != "step" and value != "":
                    curves[name].append((int(row["step"]), float(value)))
    return dict(curves)


def mlflow_client(where: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"file:{where / 'mlruns'}")


def mlflow_curves(where: Path, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = mlflow_client(where)
    names = client.get_run(run_id).data.metrics
    # MLflow keeps a metric's history in the order it was logged.
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in names}


def mlflow_name(name: str) -> str:
    """The name Lightning's MLFlowLogger logs a metric under (MLflow refuses '@')."""
    return re.sub("[^a-zA-Z0-9_/. -]+", "", name)


def assert_same_curves(expected: dict, got: dict, rename=lambda n: n) -> None:
    assert {rename(n) for n in expected} == set(got)
    for name, points in expected.items():
        mine = got[rename(name)]
        assert [s for s, _ in mine] == [s for s, _ in points], name
        # TensorBoard stores float32
        assert [v for _, v in mine] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-7), name


def assert_each_logger_has_the_run(run: Path, where: Path) -> str:
    """CSV and MLflow hold TensorBoard's curves (every name, step and value), its final figures
    (metrics.json's) and its hyperparameters; returns the MLflow run id."""
    record = json.loads((run / "loggers.json").read_text())
    assert [r["class_path"].rsplit(".", 1)[-1] for r in record] == ["CSVLogger", "MLFlowLogger"]
    run_id = record[1]["version"]
    tensorboard = tensorboard_curves(run)
    assert_same_curves(tensorboard, csv_curves(where))
    assert_same_curves(tensorboard, mlflow_curves(where, run_id), rename=mlflow_name)
    summary = json.loads((run / "metrics.json").read_text())
    finals = {k: v for k, v in summary["metrics"].items() if v is not None}
    assert finals and {k: tensorboard[f"final/{k}"] for k in finals} == {
        k: [(0, pytest.approx(v, rel=1e-6))] for k, v in finals.items()
    }
    hparams = tensorboard_hparams(run)
    assert {"mix", "divergence", "lr", "max_steps", "student"} <= set(hparams)
    (csv_hparams,) = (where / "csv").rglob("hparams.yaml")
    csv_hparams = yaml.safe_load(csv_hparams.read_text())
    assert csv_hparams == hparams
    params = mlflow_client(where).get_run(run_id).data.params
    assert params == {k: str(v)[:250] for k, v in csv_hparams.items()}  # Lightning cuts at 250
    assert mlflow_client(where).get_run(run_id).info.status == "FINISHED"
    return run_id


SHORT = [
    "--model.init_args.execution.compile_decoding=false",  # eager: compiling would take most of the test
    "--model.init_args.execution.compile_forwards=false",
    "--trainer.max_steps=2",
    "--trainer.val_check_interval=1",
    "--trainer.log_every_n_steps=1",
    "--data.batch_size=4",
    "--data.train_size=64",
    "--data.evaluation.val_size=8",
    "--data.evaluation.test_size=8",
    "--data.evaluation.batch_size=8",
    "--data.sampling.max_new_tokens=12",
    "--data.evaluation.max_new_tokens=12",
]


@pytest.mark.slow
def test_further_loggers_get_what_tensorboard_and_metrics_json_get(tiny_world_cache, tmp_path, monkeypatch):
    from distill.lightning_cli import run_lightning_cli

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for it to use ./mlruns
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    extra = ["--trainer.logger", json.dumps(loggers_config(tmp_path))]
    run_lightning_cli(
        ["fit", "--config", "configs/tiny/first.yaml", *SHORT, *extra, "--run_dir", str(run)]
    )
    assert_each_logger_has_the_run(run, tmp_path)


# --- a killed run, resumed ------------------------------------------------------------------------------
def short_config(where: Path) -> Path:
    """configs/tiny/base.yaml for 8 steps, a checkpoint every 3, validation every 4, every
    measurement callback on a few prompts, and the faults of tests/faults/inject.py."""
    base = ROOT / "configs" / "tiny" / "base.yaml"
    callbacks = yaml.safe_load(base.read_text())["trainer"]["callbacks"]
    smaller = {
        "TaskEvaluation": {"num_problems": 4, "num_samples": 2, "ks": [1, 2]},
        "Forgetting": {"num_examples": 8, "every_n_steps": 2},
        "StyleProbe": {"num_prompts": 8, "every_n_steps": 2},
        "UpdateSparsity": {"every_n_steps": 2},
        "GradientStats": {"every_n_steps": 1},
    }
    for callback in callbacks:
        callback.setdefault("init_args", {}).update(
            smaller.get(callback["class_path"].rsplit(".", 1)[-1], {})
        )
    config = {
        "base": str(base),
        "checkpoint_every_n_steps": 3,
        "model": {"init_args": {"execution": {"compile_decoding": False, "compile_forwards": False}}},
        "trainer": {
            "max_steps": 8,
            "val_check_interval": 4,
            "log_every_n_steps": 1,
            "callbacks": [*callbacks, {"class_path": "inject.KillAt"}],
            "logger": loggers_config(where),
        },
        "data": {
            "batch_size": 4,
            "train_size": 48,
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


TIMING = ("cost/wall_s", "cost/time/")  # wall-clock figures differ between any two runs


RESUMED = "test_a_resumed_run_continues_each_loggers_run_without_a_step_twice"
# First among the early jobs (tests/conftest.py): two short fits, whose test then resumes one in the
# main thread while the longer jobs run.
EARLY_ORDER = 0
SESSION: dict = {}  # where `early_jobs` put the resumed test's two first fits


def fits_env(quick_world: Path) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "faults")]),
        "DISTILL_CACHE": str(quick_world.parent),
        "OMP_NUM_THREADS": "1",
        "MLFLOW_ALLOW_FILE_STORE": "true",
    }


def early_jobs(request, selected: set[str]) -> dict:
    """The resumed test's uninterrupted fit and the fit killed after step 5, for `start_early`
    (tests/conftest.py) to start at the session's start."""
    if RESUMED not in selected:
        return {}
    env = fits_env(request.getfixturevalue("quick_world"))
    where = SESSION["where"] = request.getfixturevalue("tmp_path_factory").mktemp("loggers")
    jobs = {}
    for name, armed in (("reference", {}), ("killed", {"DISTILL_TEST_KILL_AT_STEP": "5"})):
        (where / name).mkdir()
        command = [sys.executable, "-m", "distill.cli", "fit", "--config", str(short_config(where / name))]
        command += ["--run_dir", str(where / name / "run")]
        jobs[f"loggers/{name}"] = (command, 1, dict(cwd=ROOT, env={**env, **armed}, timeout=900))
    return jobs


@pytest.mark.slow
def test_a_resumed_run_continues_each_loggers_run_without_a_step_twice(
    quick_world, cores, early, monkeypatch
):
    """Killed after step 5 and resumed from step 3's checkpoint, each logger holds what it holds
    after an uninterrupted run: every figure at the same steps (none twice), the same values
    (wall-clock figures aside), in the same MLflow run and CSV version as before the kill."""
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # this process reads the store too
    done = early("loggers/reference").result()
    tmp_path = SESSION["where"]
    assert done.returncode == 0, done.stderr[-2000:]
    reference_id = assert_each_logger_has_the_run(tmp_path / "reference" / "run", tmp_path / "reference")
    reference = csv_curves(tmp_path / "reference")

    where, run = tmp_path / "killed", tmp_path / "killed" / "run"
    killed = early("loggers/killed").result()
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    run_id = json.loads((run / "loggers.json").read_text())[1]["version"]
    sent = csv_curves(where)
    assert max(s for s, _ in sent["train/loss"]) == 2  # Lightning logs step 3's figures at step 2
    assert mlflow_curves(where, run_id)["train/loss"] == sent["train/loss"]

    resumed = cores.run(
        [sys.executable, "-m", "distill.cli", "fit", "--config", str(where / "short.yaml")]
        + ["--run_dir", str(run), "--ckpt_path", "last"],
        cwd=ROOT,
        env=fits_env(quick_world),
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert assert_each_logger_has_the_run(run, where) == run_id  # the same MLflow run, continued
    assert len(list((where / "csv" / "run").iterdir())) == 1  # the same CSV version, continued
    for curves in (csv_curves(where), mlflow_curves(where, run_id)):
        assert {mlflow_name(n) for n in curves} == {mlflow_name(n) for n in reference}
    got = csv_curves(where)
    for name, points in reference.items():
        assert [s for s, _ in got[name]] == [s for s, _ in points], name
        if not name.startswith(TIMING) and not name.startswith("final/cost/"):
            assert [v for _, v in got[name]] == pytest.approx([v for _, v in points]), name
    assert [s for s, _ in got["train/loss"]] == list(range(8))
    assert reference_id != run_id


# --- the pieces, without a fit ------------------------------------------------------------------------
class Recording:
    """A stand-in for a Lightning logger: what reached it, in order."""

    def __init__(self):
        self.calls: list[tuple] = []

    def log_metrics(self, metrics, step=None):
        self.calls.append(("metrics", dict(metrics), step))

    def log_hyperparams(self, params, *args, **kwargs):
        self.calls.append(("hparams", dict(params)))

    def save(self):
        pass

    def finalize(self, status):
        self.calls.append(("finalize", status))

    def after_save_checkpoint(self, callback):
        self.calls.append(("checkpoint",))


def metric_calls(recording: Recording) -> list[tuple[dict, int]]:
    return [(c[1], c[2]) for c in recording.calls if c[0] == "metrics"]


def test_held_logger_sends_what_a_checkpoint_holds():
    from distill.loggers import HeldLogger

    inner = Recording()
    held = HeldLogger(inner)
    held.log_metrics({"a": 1.0}, 0)
    held.log_metrics({"a": 2.0}, 1)
    assert metric_calls(inner) == []  # no checkpoint holds them yet
    held.after_save_checkpoint(None)  # the checkpoint of step 2
    assert metric_calls(inner) == [({"a": 1.0}, 0), ({"a": 2.0}, 1)]
    held.log_metrics({"a": 3.0}, 2)  # logged after the save, before the next batch: the checkpoint's
    assert metric_calls(inner)[-1] == ({"a": 3.0}, 2)
    held.hold()  # the next batch starts
    held.log_metrics({"a": 4.0}, 3)
    held.finalize("failed")  # a failure: a resume logs step 3 again
    assert metric_calls(inner)[-1] == ({"a": 3.0}, 2) and inner.calls[-1] == ("finalize", "failed")
    held.log_final({"mix": 0.5}, {"final/a": 4.0})  # the run's end
    assert inner.calls[-4:] == [
        ("metrics", {"a": 4.0}, 3),
        ("hparams", {"mix": 0.5}),
        ("metrics", {"final/a": 4.0}, 0),
        ("finalize", "success"),
    ]


def test_held_logger_on_a_resume_drops_what_is_below_the_resume_step():
    from distill.loggers import HeldLogger

    inner = Recording()
    held = HeldLogger(inner, resume_step=3)
    held.log_metrics({"data/rows": 1.0}, 0)  # a one-off logged again by the resumed run
    held.log_metrics({"train/loss": 1.0}, 3)
    held.deliver()
    assert metric_calls(inner) == [({"train/loss": 1.0}, 3)]
    passing = HeldLogger(Recording(), hold=False)  # no checkpoints: nothing to wait for
    passing.log_metrics({"a": 1.0}, 0)
    assert metric_calls(passing.inner) == [({"a": 1.0}, 0)]


def test_a_resume_continues_the_recorded_runs(tmp_path):
    from jsonargparse import Namespace

    from distill.loggers import RECORD, continue_runs

    (tmp_path / RECORD).write_text(
        json.dumps(
            [
                {
                    "class_path": "lightning.pytorch.loggers.csv_logs.CSVLogger",
                    "arg": "version",
                    "version": 3,
                },
                {
                    "class_path": "lightning.pytorch.loggers.mlflow.MLFlowLogger",
                    "arg": "run_id",
                    "version": "abc",
                },
            ]
        )
    )

    def entry(path: str, **init_args) -> Namespace:
        return Namespace(class_path=path, init_args=Namespace(**init_args))

    trainer = Namespace(logger=[entry(CSV, save_dir="x", version=None), entry(MLFLOW, run_id=None)])
    continue_runs(trainer, tmp_path)
    assert trainer.logger[0].init_args.version == 3 and trainer.logger[1].init_args.run_id == "abc"
    # a run the config names stays; a logger of another class at that position is not given it
    trainer = Namespace(logger=[entry(CSV, save_dir="x", version=7), entry(CSV, save_dir="y", version=None)])
    continue_runs(trainer, tmp_path)
    assert [e.init_args.version for e in trainer.logger] == [7, None]


def test_a_resumed_csv_log_keeps_its_rows(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    from distill.loggers import keep_csv_rows

    first = CSVLogger(tmp_path, name="run")
    first.log_metrics({"a": 1.0}, step=0)
    first.log_metrics({"b": 2.0}, step=1)
    first.save()
    again = CSVLogger(tmp_path, name="run", version=first.version)
    keep_csv_rows(again)  # Lightning's writer alone would delete the file
    again.log_metrics({"a": 3.0}, step=2)
    again.save()
    rows = list(csv.DictReader(open(Path(again.log_dir) / "metrics.csv")))
    assert [(r["step"], r["a"], r["b"]) for r in rows] == [
        ("0", "1.0", ""),
        ("1", "", "2.0"),
        ("2", "3.0", ""),
    ]


def test_a_resume_drops_the_tensorboard_events_written_after_the_checkpoints_boundary(tmp_path):
    import time

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    from distill.loggers import COVERED, open_and_record, tensorboard_resume

    tensorboard, now = tmp_path / "tensorboard", time.time()
    writer = SummaryWriter(tensorboard)
    writer.add_scalar("callback/x", 1.0, 3, walltime=now + 1)  # batch 3, before its checkpoint
    writer.add_scalar("train/loss", 2.0, 2, walltime=now + 2)  # batch 3, logged after the save
    writer.add_scalar("train/loss", 3.0, 3, walltime=now + 4)  # batch 4: the resume logs it again
    writer.close()
    (tensorboard / COVERED).write_text(json.dumps({"step": 3, "wall_time": now + 3}))
    assert tensorboard_resume(tensorboard, 3) == {}
    open_and_record([], tmp_path, 3)
    events = EventAccumulator(str(tensorboard))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(2, 2.0)]
    assert [(e.step, e.value) for e in events.Scalars("callback/x")] == [(3, 1.0)]
    # killed before the boundary of the checkpoint it resumes from: nothing past it was written
    assert tensorboard_resume(tensorboard, 6) == {}
    # no boundary recorded (an older run directory): TensorBoard's purge by step
    assert tensorboard_resume(tmp_path / "elsewhere", 6) == {"purge_step": 7}


# --- a logger that cannot be built or opened ---------------------------------------------------------
@pytest.fixture
def no_model_loads(monkeypatch):
    import distill.module as module

    monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))


@pytest.mark.parametrize(
    "logger, env, message",
    [
        (
            {"class_path": CSV, "init_args": {"save_dir": "x", "bogus": 1}},
            {},
            "trainer.logger.init_args.bogus: lightning.pytorch.loggers.CSVLogger has no option 'bogus'; "
            "it takes: save_dir, name, version, prefix, flush_logs_every_n_steps",
        ),
        (
            {"class_path": "lightning.pytorch.loggers.NoSuchLogger"},
            {},
            "trainer.logger must be a subclass of Logger, one of: ",
        ),
        (
            {"class_path": MLFLOW, "init_args": {"tracking_uri": "file:{tmp}/mlruns"}},
            {"MLFLOW_ALLOW_FILE_STORE": "false"},
            "trainer.logger[0]: lightning.pytorch.loggers.MLFlowLogger: The filesystem tracking backend",
        ),
        (
            {"class_path": CSV, "init_args": {"save_dir": "{tmp}/file/csv"}},
            {},
            "trainer.logger[0] (CSVLogger) cannot open its run: ",
        ),
    ],
    ids=["unknown_option", "unknown_class", "mlflow_refuses", "csv_unwritable"],
)
def test_a_logger_that_cannot_be_built_fails_in_one_line_before_any_compute(
    logger, env, message, tiny_world_cache, tmp_path, capsys, monkeypatch, no_model_loads
):
    from distill.lightning_cli import run_lightning_cli

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    (tmp_path / "file").write_text("a file where the logger wants a folder")
    monkeypatch.chdir(ROOT)
    config = json.loads(json.dumps(logger).replace("{tmp}", str(tmp_path)))
    with pytest.raises(SystemExit) as exit_info:
        run_lightning_cli(
            [
                "fit",
                "--config",
                "configs/tiny/base.yaml",
                "--trainer.logger",
                json.dumps([config]),
                "--run_dir",
                str(tmp_path / "run"),
            ]
        )
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("distill fit: error: ") and message in err[0], err
    if "one of" in message:  # every logger Lightning ships is listed
        assert all(
            name in err[0] for name in ("CSVLogger", "MLFlowLogger", "TensorBoardLogger", "WandbLogger")
        )
