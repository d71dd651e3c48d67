"""The pieces behind the run guarantees, each against an independent expectation: the resumable
shuffle, the non-finite guard, atomic checkpoints, strict metrics, the report's left-out runs and
the sweep's respect for a run directory another process holds."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from distill.data.order import ResumableShuffle
from distill.errors import Diverged
from distill.experiments.run.records import load_records, run_problem
from distill.run_record import AtomicCheckpointIO
from distill.rundir import RunDirError, RunLock, config_changes, finite_metrics
from distill.training import NonFiniteGuard, check_optimizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n, seed", [(10, 0), (37, 12345), (96, 123)])
def test_shuffle_orders_are_what_lightning_read_from_a_seeded_shuffling_loader(n, seed):
    """Epoch e of `ResumableShuffle` equals the e-th pass of `DataLoader(shuffle=True, generator=
    Generator().manual_seed(seed), drop_last=True)` read as Lightning reads it, `len(loader)`
    batches a pass (the order the project used before resume existed)."""
    loader = DataLoader(
        list(range(n)),
        batch_size=4,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    shuffle = ResumableShuffle(n, seed)
    for epoch in range(3):
        expected = [int(i) for batch in itertools.islice(iter(loader), len(loader)) for i in batch]
        shuffle.set_epoch(epoch)
        order = list(shuffle)
        assert order[: len(expected)] == expected and sorted(order) == list(range(n))


@pytest.mark.slow
def test_shuffle_matches_a_real_lightning_loop_across_epochs():
    """The same, through `Trainer.fit` itself (96 prompts, batches of 16: two whole epochs)."""
    import lightning as L

    seen: list[list[int]] = []

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            seen.append(batch.tolist())
            self.optimizers().step()

        def configure_optimizers(self):
            return torch.optim.SGD([self.weight], lr=0.1)

    loader = DataLoader(
        list(range(96)),
        batch_size=16,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(5),
    )
    trainer = L.Trainer(
        max_steps=12,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Recorder(), loader)
    shuffle = ResumableShuffle(96, 5)
    assert [i for batch in seen for i in batch] == shuffle.order(0) + shuffle.order(1)


def test_shuffle_resumes_mid_epoch_then_runs_whole_epochs():
    shuffle = ResumableShuffle(12, seed=7)
    full = [shuffle.order(e) for e in range(2)]
    shuffle.resume(epoch=0, consumed=8)
    assert list(shuffle) == full[0][8:] and len(shuffle) == 12
    assert list(shuffle) == full[0]  # the skip applies once
    shuffle.resume(epoch=0, consumed=4)
    shuffle.set_epoch(1)  # a new epoch drops a pending skip of the old one
    assert list(shuffle) == full[1]


def test_guard_skips_counts_and_stops_after_patience():
    guard = NonFiniteGuard(3)
    assert guard.step_ok(torch.tensor(1.0), torch.tensor(2.0))
    assert not guard.step_ok(torch.tensor(math.nan), torch.tensor(1.0))
    assert not guard.step_ok(torch.tensor(1.0), torch.tensor(math.inf))
    assert guard.step_ok(1.0, 1.0) and guard.in_a_row == 0 and guard.skipped == 2
    assert not guard.step_ok(math.nan, 1.0) and not guard.step_ok(math.nan, 1.0)
    with pytest.raises(Diverged, match="3 steps in a row had a non-finite loss or gradient norm"):
        guard.step_ok(-math.inf, 1.0)
    restored = NonFiniteGuard(3)
    restored.load_state_dict(guard.state_dict())
    assert (restored.skipped, restored.in_a_row) == (5, 3)
    with pytest.raises(ValueError, match="model.max_nonfinite_steps must be an integer >= 1, got 0"):
        NonFiniteGuard(0)


def test_a_skipped_step_leaves_weights_and_optimiser_untouched(quick_world):
    """`DistillationModule.training_step` with a NaN loss: no parameter, optimiser moment or step
    count changes, and the skip is counted."""
    from distill.module import DistillationModule
    from distill.rollout import RolloutSampler

    module = DistillationModule(str(quick_world / "student"), str(quick_world / "teacher"))
    module.configure_model()
    optimizer = torch.optim.AdamW(module.student.parameters(), lr=1e-2)
    module.optimizers = lambda: optimizer
    module.lr_schedulers = lambda: None
    module.log = lambda *a, **k: None
    enc = module.tokenizer(["12 3 4=9:", "5 6 7=8:"], return_tensors="pt", padding=True)
    rollout = RolloutSampler(mix=1.0, max_new_tokens=6).sample(
        module.student, module.teacher, enc["input_ids"], enc["attention_mask"], seed=0
    )
    module.training_step({"rollout": rollout}, 0)  # a finite step: Adam state exists from here on
    before = {n: p.detach().clone() for n, p in module.student.named_parameters()}
    state = {k: v.clone() for k, v in optimizer.state[next(iter(module.student.parameters()))].items()}
    with torch.no_grad():
        module.student.get_output_embeddings().weight[0, 0] = math.nan  # NaN logits -> NaN loss
    module.training_step({"rollout": rollout}, 1)
    assert module.loop.guard.skipped == 1
    for name, p in module.student.named_parameters():
        expected = before[name].clone()
        if p is module.student.get_output_embeddings().weight:
            expected[0, 0] = math.nan
        torch.testing.assert_close(p.detach(), expected, equal_nan=True)
    after = optimizer.state[next(iter(module.student.parameters()))]
    assert all(torch.equal(after[k], v) for k, v in state.items())


def test_optimizer_settings_are_checked_without_a_model():
    check_optimizer(lambda params: torch.optim.AdamW(params, lr=1e-3))
    with pytest.raises(ValueError, match="model.optimizer: Invalid learning rate: -1"):
        check_optimizer(lambda params: torch.optim.AdamW(params, lr=-1))
    with pytest.raises(ValueError, match="model.lr_scheduler: You must define either total_steps"):
        check_optimizer(
            lambda params: torch.optim.SGD(params, lr=0.1),
            lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1),
        )


def test_atomic_checkpoint_keeps_the_old_file_when_a_write_fails(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)

    class Unsaveable:
        def __reduce__(self):
            raise RuntimeError("cannot be saved")

    with pytest.raises(RuntimeError, match="cannot be saved"):  # fails midway through torch.save
        io.save_checkpoint({"step": 2, "bad": Unsaveable()}, path)
    assert torch.load(path, weights_only=False) == {"step": 1}
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temporary left behind


def test_finite_metrics_and_strict_json(tmp_path):
    from distill.runinfo import write_json_atomic

    strict, bad = finite_metrics({"a": 1.0, "b": math.nan, "c": -math.inf})
    assert strict == {"a": 1.0, "b": None, "c": None} and bad == ["b", "c"]
    with pytest.raises(ValueError):
        write_json_atomic(tmp_path / "x.json", {"a": math.nan})
    assert not (tmp_path / "x.json").exists()


def test_config_changes_ignore_where_and_how_a_run_resumes():
    old = {"run_dir": "a", "ckpt_path": None, "model": {"lr": 1e-3, "beta": 0.5}, "data": {"mix": 0}}
    new = {"run_dir": "b", "ckpt_path": "x", "model": {"lr": 1e-2, "beta": 0.5}, "data": {"mix": 0, "k": 1}}
    assert config_changes(old, new) == {"data.k": (None, 1), "model.lr": (1e-3, 1e-2)}


def _run(sweep: Path, name: str, metrics: dict | str | None) -> None:
    run = sweep / name
    run.mkdir(parents=True)
    (run / "settings.json").write_text(json.dumps({"settings": {"mix": float(len(name))}}))
    if isinstance(metrics, str):
        (run / "metrics.json").write_text(metrics)
    elif metrics is not None:
        (run / "metrics.json").write_text(json.dumps(metrics))


def test_report_records_say_why_a_run_is_left_out(tmp_path):
    ok = {"status": "finished", "metrics": {"test/countdown3/accuracy": 0.5}}
    _run(tmp_path, "ok", ok)
    _run(tmp_path, "killed", None)
    _run(tmp_path, "truncated", '{"status": "fini')
    _run(tmp_path, "nan", '{"status": "finished", "metrics": {"test/countdown3/accuracy": NaN}}')
    _run(tmp_path, "null", {"status": "finished", "metrics": {"a": None}, "nonfinite": ["a"]})
    _run(tmp_path, "diverged", {"status": "diverged", "reason": "3 steps in a row", "metrics": {}})
    _run(tmp_path, "empty", {"status": "finished", "metrics": {}})
    problems = {r.name: r.problem for r in load_records(tmp_path)}
    assert problems == {
        "ok": None,
        "killed": "unfinished",
        "truncated": "malformed metrics.json",
        "nan": "non-finite metrics: test/countdown3/accuracy",
        "null": "non-finite metrics: a",
        "diverged": "diverged: 3 steps in a row",
        "empty": "malformed metrics.json (no metrics)",
    }
    assert run_problem(tmp_path / "ok", ok) is None


def test_report_lists_left_out_runs_with_their_reasons(tmp_path, capsys):
    from distill.experiments.report.report import main as report_main

    sweep = tmp_path / "sweep"
    for i, acc in enumerate([0.2, 0.4]):
        _run(sweep, f"ok{i}", {"status": "finished", "metrics": {"test/countdown3/accuracy": acc}})
    _run(sweep, "bad", '{"status": "finished", "metrics": {"test/countdown3/accuracy": NaN}}')
    assert report_main([str(sweep), "--out", str(tmp_path / "report")]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    assert "2 finished runs of 3" in text
    assert "- `bad`: non-finite metrics: test/countdown3/accuracy" in text
    assert "[report] left out bad: non-finite metrics" in capsys.readouterr().err


def test_lock_is_exclusive_across_processes_and_dies_with_its_holder(tmp_path, hold_lock):
    holder = hold_lock(tmp_path)
    with pytest.raises(RunDirError, match=f"is in use by pid {holder.pid} on "):
        RunLock(tmp_path).acquire()
    holder.kill()  # SIGKILL: the kernel drops the lock, nothing goes stale
    holder.wait()
    RunLock(tmp_path).acquire().release()


def test_sweep_never_prepares_a_run_directory_another_process_holds(tmp_path):
    from distill.experiments.run import rundirs
    from distill.experiments.run.spec import Run

    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "partial.txt").write_text("an orphaned fit is still writing here")
    run = Run(name="run", run_dir=run_dir, settings={}, overrides={})
    lock = RunLock(run_dir).acquire()
    try:
        with pytest.raises(RunDirError, match="run 'run': its directory"):
            rundirs.prepare_run_dir(run, "sweep")
        assert (run_dir / "partial.txt").exists()
    finally:
        lock.release()
    assert rundirs.prepare_run_dir(run, "sweep") == "todo" and not (run_dir / "partial.txt").exists()


def test_options_added_since_a_checkpoint_do_not_block_its_resume_at_their_defaults():
    """A checkpoint written before the code gained an option has no key for it; the resume's config
    has it at the default, which is no change. Set to anything else, it is one."""
    from distill.data import RolloutDataModule

    module = {"class_path": "distill.module.DistillationModule", "init_args": {"student": "s"}}
    old = {"model": module, "data": {"mix": 0}}
    added = {"lean_logits": True, "eval_logit_budget_mb": 512, "gradient_checkpointing": False}
    new = {
        "model": {**module, "init_args": {"student": "s", "max_nonfinite_steps": 5, "execution": added}},
        "data": {"mix": 0, "prompts": {"teacher_context": None}},
    }
    assert config_changes(old, new, {"data": RolloutDataModule}) == {}
    new["model"]["init_args"]["execution"]["gradient_checkpointing"] = True
    new["data"]["prompts"]["teacher_context"] = "Reason in Spanish."
    assert config_changes(old, new, {"data": RolloutDataModule}) == {
        "data.prompts.teacher_context": (None, "Reason in Spanish."),
        "model.init_args.execution.gradient_checkpointing": (None, True),
    }
    # Without the data class, a new data key counts; an unimportable class_path counts too.
    assert "data.group_size" in config_changes(old, {**new, "data": {"mix": 0, "group_size": 1}})
    broken = {"model": {"class_path": "no.such.Module", "init_args": {"student": "s", "x": 1}}}
    assert config_changes({"model": {"class_path": "no.such.Module", "init_args": {"student": "s"}}}, broken)


def test_a_recorded_optimizer_change_reaches_optimizers_restored_by_the_strategy():
    """A resume's recorded change (lr 1e-3 -> 1e-2) lands in the checkpoint's optimiser state (what
    Lightning restores) and, when training starts, in the live optimisers, for a strategy that
    restored them itself before the edit (FSDP2's ModelParallelStrategy); a fresh run is left
    alone."""
    from types import SimpleNamespace

    from distill.run_record import RunRecord

    def adamw():
        return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3, betas=(0.9, 0.999))

    change = {"lr": 1e-2, "betas": [0.8, 0.99]}
    restored = adamw()  # what the strategy loaded from the file, before any callback saw it
    checkpoint = {"optimizer_states": [adamw().state_dict()]}
    record = RunRecord({}, optimizer_changes=change)
    record.on_load_checkpoint(None, None, checkpoint)
    assert checkpoint["optimizer_states"][0]["param_groups"][0]["lr"] == 1e-2
    assert restored.param_groups[0]["lr"] == 1e-3
    record.on_train_start(SimpleNamespace(optimizers=[restored]), None)
    assert restored.param_groups[0]["lr"] == 1e-2 and restored.param_groups[0]["betas"] == (0.8, 0.99)
    fresh = adamw()
    RunRecord({}, optimizer_changes=change).on_train_start(SimpleNamespace(optimizers=[fresh]), None)
    assert fresh.param_groups[0]["lr"] == 1e-3


def test_replace_atomic_swaps_a_file_or_a_folder_and_keeps_the_old_on_failure(tmp_path):
    from distill.runinfo import replace_atomic

    target = tmp_path / "out" / "model"
    replace_atomic(target, lambda tmp: (tmp.mkdir(), (tmp / "a.txt").write_text("1")))
    assert (target / "a.txt").read_text() == "1"
    replace_atomic(target, lambda tmp: (tmp.mkdir(), (tmp / "b.txt").write_text("2")))
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]  # the old folder went whole

    def half_then_fail(tmp):
        tmp.mkdir()
        (tmp / "c.txt").write_text("partial")
        raise RuntimeError("killed mid-way")

    with pytest.raises(RuntimeError, match="killed mid-way"):
        replace_atomic(target, half_then_fail)
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["model"]  # no temporary left behind
    single = tmp_path / "curves.csv"
    replace_atomic(single, lambda tmp: tmp.write_text("x\n"))
    replace_atomic(single, lambda tmp: tmp.write_text("y\n"))
    assert single.read_text() == "y\n" and sorted(p.name for p in tmp_path.iterdir()) == ["curves.csv", "out"]
