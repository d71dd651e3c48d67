"""Reference runs (the start and the teacher): spec, runner, archive and report (fake fit/test)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from distill.experiments.report.report import main as report_main
from distill.experiments.run import rundirs
from distill.experiments.run.references import load_references, model_option, reference_runs
from distill.experiments.run.spec import SpecError, expand, parse_spec
from distill.experiments.run.sweep import main

GRID = ["mix=0,seed=3", "mix=0.5,seed=3", "mix=0,seed=1", "mix=0.5,seed=1"]


def _spec(tmp_path, **extra):
    (tmp_path / "b.yaml").write_text(
        "model: {init_args: {student: s, teacher: t, teacher_dtype: bfloat16}}\n"
    )
    data = {"name": "g", "base": "b.yaml", "out": "out", "axes": {"seed": [2, 0], "mix": [0, 1]}} | extra
    return parse_spec(data, root=tmp_path)


def test_references_default_on_and_use_the_runs_configs_at_the_first_seed(tmp_path):
    spec = _spec(tmp_path, overrides={"trainer.max_steps": 9})
    assert spec.references == ("start", "teacher") and len(expand(spec)) == 4  # not in the grid
    (start, teacher), notes = reference_runs(spec)
    assert notes == []
    assert (start.name, start.run_dir, start.reference) == (
        "references/start",
        tmp_path / "out/references/start",
        "start",
    )
    assert start.overrides == {"trainer.max_steps": 9, "seed_everything": 2} and start.settings == {}
    assert teacher.run_dir == tmp_path / "out/references/teacher"
    # the teacher in the student's place, loaded as the teacher is
    assert teacher.overrides == {
        "trainer.max_steps": 9,
        "seed_everything": 2,
        "model.student": "t",
        "model.student_dtype": "bfloat16",
    }
    cmd = rundirs.command(teacher, spec.base, ["python", "-m", "distill.cli", "fit"])
    assert cmd == [
        "python", "-m", "distill.cli", "test",
        "--config", str(tmp_path / "b.yaml"),
        "--config", str(teacher.run_dir / "overrides.yaml"),
        "--run_dir", str(teacher.run_dir),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("value", "kinds"), [(False, ()), (True, ("start", "teacher")), (["teacher"], ("teacher",))]
)
def test_references_can_be_turned_off_or_chosen(tmp_path, value, kinds):
    spec = _spec(tmp_path, references=value)
    assert tuple(r.reference for r in reference_runs(spec)[0]) == kinds


@pytest.mark.parametrize(
    "value", ["yes please", 1, None, [], ["start", "start"], ["student"], {"start": True}]
)
def test_a_bad_references_value_names_the_field(tmp_path, value):
    with pytest.raises(SpecError, match=r"'references' must be true, false or a list of distinct names"):
        _spec(tmp_path, references=value)


def test_axes_that_change_how_runs_are_tested_need_references_off(tmp_path):
    with pytest.raises(
        SpecError, match=r"'references': axis 'data.evaluation.test_size' sets data.evaluation.test_size.*references: false"
    ):
        _spec(tmp_path, axes={"data.evaluation.test_size": [10, 20]})
    with pytest.raises(SpecError, match="axis 'data.test_size' sets data.evaluation.test_size"):  # old key
        _spec(tmp_path, axes={"data.test_size": [10, 20]})
    with pytest.raises(SpecError, match="'references': axis 'model.teacher' sets model.teacher"):
        _spec(tmp_path, axes={"model.init_args.teacher": ["a", "b"]})
    assert _spec(tmp_path, axes={"data.evaluation.test_size": [10, 20]}, references=False).references == ()


def test_a_config_without_teacher_gets_only_the_start_unless_the_teacher_is_listed(tmp_path):
    (tmp_path / "grpo.yaml").write_text(
        "model: {class_path: distill.rl.GRPOModule, init_args: {student: s}}\n"
    )
    spec = parse_spec({"name": "g", "base": "grpo.yaml", "axes": {"mix": [0]}}, root=tmp_path)
    runs, notes = reference_runs(spec)
    assert [r.reference for r in runs] == ["start"] and "teacher reference skipped" in notes[0]
    listed = parse_spec(
        {"name": "g", "base": "grpo.yaml", "axes": {"mix": [0]}, "references": ["teacher"]}, root=tmp_path
    )
    with pytest.raises(SpecError, match="'references' lists teacher, but the configs set no model.teacher"):
        reference_runs(listed)


def test_the_teacher_is_read_through_base_includes_and_overrides(tmp_path):
    (tmp_path / "a.yaml").write_text("model: {init_args: {teacher: first}}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\ntrainer: {max_steps: 1}\n")
    assert model_option([tmp_path / "b.yaml"], {}, "teacher") == "first"
    assert model_option([tmp_path / "b.yaml"], {"model.teacher": "over"}, "teacher") == "over"
    assert model_option([tmp_path / "missing.yaml"], {}, "teacher") is None


def test_the_teacher_reference_reads_the_teacher_only_context(tmp_path):
    (tmp_path / "a.yaml").write_text(
        "model: {init_args: {teacher: t}}\ndata: {prompts: {teacher_context: 'Reason in Spanish.'}}\n"
    )
    spec = parse_spec({"name": "s", "base": "a.yaml", "axes": {"mix": [0]}}, root=tmp_path)
    runs, _ = reference_runs(spec)
    by_kind = {r.reference: r.overrides for r in runs}
    assert by_kind["teacher"]["data.prompts.student_context"] == "Reason in Spanish."
    assert by_kind["start"] == {}  # the start is the student: it reads its own prompt
    context = "prompts.teacher_context"
    assert model_option([tmp_path / "a.yaml"], {"data.prompts.teacher_context": "x"}, context, "data") == "x"
    assert model_option([tmp_path / "a.yaml"], {"data.teacher_context": "y"}, context, "data") == "y"  # old key
    (tmp_path / "old.yaml").write_text("data: {teacher_context: 'Piensa.'}\n")  # written before the move
    assert model_option([tmp_path / "old.yaml"], {}, context, "data") == "Piensa."


def test_staged_references_belong_to_the_first_stage(tmp_path):
    (tmp_path / "d.yaml").write_text("model: {init_args: {teacher: t}}\n")
    spec = parse_spec(
        {
            "name": "chain",
            "out": "out",
            "stages": [
                {"name": "distill", "base": "d.yaml", "axes": {"mix": [0, 1]}},
                {"name": "grpo", "after": "distill", "base": "g.yaml"},
            ],
        },
        root=tmp_path,
    )
    runs, _ = reference_runs(spec)
    assert [r.name for r in runs] == ["distill/references/start", "distill/references/teacher"]
    assert runs[0].run_dir == tmp_path / "out/distill/references/start" and runs[0].stage == "distill"
    assert runs[0].base == [tmp_path / "d.yaml"]


def test_test_problems_do_not_depend_on_the_run_seed(char_tok):
    """Why one reference serves every seed: the test sets (and TaskEvaluation's problems, their
    first rows) come from a fixed generator seed, whatever `seed_everything` / `data.seed` is."""
    from distill.data import RolloutDataModule

    sets = []
    for seed in (0, 7):
        tasks = ["countdown3", "countdown4", "countdown5"]
        dm = RolloutDataModule(evaluation={"test_size": 20, "test_tasks": tasks}, seed=seed)
        dm.tokenizer = char_tok
        dm.setup("test")
        sets.append([[dm.test_sets[i][j] for j in range(20)] for i in range(len(dm.test_sets))])
    assert sets[0] == sets[1] and len(sets[0]) == 3


def test_dry_run_lists_the_references_first(ref_spec, fake_fit, tmp_path, capsys):
    assert main([str(ref_spec), "--dry-run"], fit_prefix=fake_fit) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["todo", "references/start"],
        ["todo", "references/teacher"],
        *(["todo", name] for name in GRID),
    ]
    command = shlex.split(lines[1].split(maxsplit=2)[2])
    assert command[:3] == [*fake_fit[:2], "test"] and "--ckpt_path" not in command
    assert "4 runs: 0 finished (skipped), 0 to resume, 4 to start; 2 references: 0 finished" in captured.err
    assert not (tmp_path / "runs").exists()

    ref_spec.write_text(ref_spec.read_text() + "references: false\n")
    assert main([str(ref_spec), "--dry-run"], fit_prefix=fake_fit) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 4 and "references" not in captured.out + captured.err


def test_sweep_runs_the_references_once_and_skips_them_when_finished(ref_spec, fake_fit, tmp_path, capsys):
    assert main([str(ref_spec), "--jobs", "2"], fit_prefix=fake_fit) == 0
    out = capsys.readouterr().out
    assert "4 finished now, 0 skipped (finished before), 0 failed; references: 2 finished now" in out
    runs = tmp_path / "runs"
    start, teacher = runs / "references" / "start", runs / "references" / "teacher"
    for ref in (start, teacher):
        (call,) = [json.loads(line) for line in (ref / "invocations.jsonl").read_text().splitlines()]
        assert call["command"] == "test" and "--ckpt_path" not in call["argv"]
        assert json.loads((ref / "settings.json").read_text())["reference"] == ref.name
        assert "$ " in (ref / "test.log").read_text()
    assert yaml.safe_load((teacher / "overrides.yaml").read_text()) == {
        "trainer": {"max_steps": 60},
        "seed_everything": 3,
        "model": {"student": "tiny-t"},
    }
    assert load_references(runs) == {
        "start": {"test/countdown3/accuracy": 0.05, "test/countdown3/pass@4": pytest.approx(0.15)},
        "teacher": {"test/countdown3/accuracy": 0.8, "test/countdown3/pass@4": pytest.approx(0.9)},
    }
    record = json.loads((runs / "sweep.json").read_text())
    assert record["runs"] == GRID and record["references"] == ["references/start", "references/teacher"]
    before = (start / "test_metrics.json").stat().st_mtime_ns

    (teacher / "test_metrics.json").write_text('{"metr')  # killed mid-write: redone from scratch
    assert main([str(ref_spec)], fit_prefix=fake_fit) == 0
    assert "0 finished now, 4 skipped (finished before), 0 failed; references: 1 finished now, 1 skipped" in (
        capsys.readouterr().out
    )
    assert (start / "test_metrics.json").stat().st_mtime_ns == before
    assert len((teacher / "invocations.jsonl").read_text().splitlines()) == 1  # cleared, run again
    assert main([str(ref_spec), "--only", "references/teacher"], fit_prefix=fake_fit) == 0
    assert "references: 0 finished now, 1 skipped" in capsys.readouterr().out


def test_references_need_a_test_command(ref_spec, tmp_path, capsys):
    assert main([str(ref_spec), "--dry-run", "--fit-prefix", "my-launcher --fit"]) == 2
    assert "does not end in 'fit'; pass --test-prefix" in capsys.readouterr().err
    assert main([str(ref_spec), "--dry-run", "--fit-prefix", "my-launcher --fit", "--test-prefix", "t"]) == 0
    assert "t --config" in capsys.readouterr().out


def test_emit_slurm_puts_the_references_in_the_array(ref_spec, fake_fit, tmp_path, capsys):
    script = tmp_path / "jobs" / "grid.sbatch"
    assert main([str(ref_spec), "--emit-slurm", str(script)], fit_prefix=fake_fit) == 0
    assert "6 array tasks" in capsys.readouterr().out
    commands = (tmp_path / "jobs" / "grid.commands").read_text().splitlines()
    assert shlex.split(commands[0])[-4:-2] == ["--only", "references/start"]


def test_report_shows_the_references_as_rows_notes_and_lines(
    ref_spec, fake_fit, tmp_path, monkeypatch, capsys
):
    assert main([str(ref_spec)], fit_prefix=fake_fit) == 0
    runs = tmp_path / "runs"
    # the archive keeps each reference's test metrics (no curves: it does not train)
    assert report_main([str(runs), "--archive", str(tmp_path / "archive"), "--n-boot", "20"]) == 0
    assert "archived 4 runs and 2 references of" in capsys.readouterr().out
    kept = sorted(p.name for p in (tmp_path / "archive" / "references" / "teacher").iterdir())
    assert kept == ["overrides.yaml", "settings.json", "test_metrics.json"]

    from distill.experiments.report import plots

    legends = {}

    def keep(fig, path):  # the legend labels of every panel, instead of a PNG
        legends[path.name] = [ax.get_legend_handles_labels()[1] for ax in fig.axes]
        return path

    monkeypatch.setattr(plots, "_save", keep)
    assert report_main([str(tmp_path / "archive"), "--out", str(tmp_path / "rep"), "--n-boot", "20"]) == 0
    text = (tmp_path / "rep" / "report.md").read_text()
    assert "4 finished runs of 4" in text and "References: `start (step 0)`" in text
    table = text.split("### test/countdown3/accuracy", 1)[1].split("###", 1)[0]
    assert "| start (step 0) | 5.0 |" in table and "| teacher | 80.0 |" in table  # accuracies in percent
    # the fake fit scores mix / 2 + 0.1: both cells (0.1, 0.35) end above the start, none at the teacher
    assert "2 of 2 cells end above the start (5.0); 0 of 2 reach the teacher (80.0)." in table
    assert "| 0.5 | **35.0 ± 0.0 (2)** |" in table  # the best cell is bold
    assert "No reference runs" not in text
    (panel,) = legends["vs_mix_test_countdown3_accuracy.png"]
    assert panel[-2:] == ["start (step 0)", "teacher"]
    csv_runs = (tmp_path / "rep" / "runs.csv").read_text()
    assert "references" not in csv_runs and len(csv_runs.splitlines()) == 5


def test_report_without_references_says_so_in_one_line(grid_spec, fake_fit, tmp_path):
    assert main([str(grid_spec)], fit_prefix=fake_fit) == 0
    assert report_main([str(tmp_path / "runs"), "--n-boot", "20", "--no-plots"]) == 0
    text = (tmp_path / "runs" / "report" / "report.md").read_text()
    assert text.count("No reference runs (start, teacher) in this sweep") == 1
    assert "start (step 0)" not in text and "cells end above" not in text


def test_reference_lines_in_validation_accuracy_curves(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    from distill.experiments.report import plots

    refs = {"start": {"test/countdown3/accuracy": 0.2}, "teacher": {"test/countdown3/accuracy": 0.7}}
    ax = Figure().subplots()
    assert plots.reference_lines(ax, refs, *plots._reference_metric("val/countdown3/accuracy", refs))
    assert [line.get_ydata()[0] for line in ax.get_lines()] == [0.2, 0.7]
    assert ax.get_legend_handles_labels()[1] == ["start (step 0) (test problems)", "teacher (test problems)"]
    assert not plots.reference_lines(Figure().subplots(), refs, "train/forward_kl")


def test_staged_sweep_runs_the_references_in_its_first_stage(tmp_path, fake_fit, capsys):
    (tmp_path / "distill.yaml").write_text(
        "model: {init_args: {student: s, teacher: t}}\ntrainer: {max_steps: 5}\ndata: {mix: 0.5}\n"
    )
    (tmp_path / "grpo.yaml").write_text("trainer: {max_steps: 2}\ndata: {mix: 0.0}\n")
    spec = tmp_path / "chain.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "chain",
                "out": str(tmp_path / "runs"),
                "stages": [
                    {"name": "distill", "base": str(tmp_path / "distill.yaml"), "axes": {"mix": [0, 0.5]}},
                    {"name": "grpo", "after": "distill", "base": str(tmp_path / "grpo.yaml")},
                ],
            }
        )
    )
    assert main([str(spec)], fit_prefix=fake_fit) == 0
    runs = tmp_path / "runs"
    assert set(load_references(runs / "distill")) == {"start", "teacher"}
    assert not (runs / "references").exists() and not (runs / "grpo" / "references").exists()
    assert json.loads((runs / "distill" / "sweep.json").read_text())["runs"] == [
        "distill/mix=0",
        "distill/mix=0.5",
    ]
    assert report_main([str(runs), "--n-boot", "20", "--no-plots"]) == 0
    # every stage's report compares with the first stage's references
    for stage in ("distill", "grpo"):
        text = (runs / "report" / stage / "report.md").read_text()
        assert "| start (step 0) | 5.0 |" in text
    assert "`distill/references/`" in (runs / "report" / "grpo" / "report.md").read_text()


@pytest.mark.slow
def test_real_references_with_distill_test_on_the_quick_tiny_world(tiny_world_cache, tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    spec = tmp_path / "refs.yaml"
    overrides = {
        "data.evaluation.test_tasks": ["countdown3"],
        "data.evaluation.test_size": 4,
        "data.evaluation.batch_size": 4,
        "data.evaluation.max_new_tokens": 8,
    }
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "refs",
                "base": str(root / "configs" / "tiny" / "base.yaml"),
                "out": str(tmp_path / "runs"),
                "overrides": overrides,
                "axes": {"seed": [0, 1]},
            }
        )
    )
    only = ["--only", "references/start", "--only", "references/teacher"]
    assert main([str(spec), *only, "--jobs", "2"]) == 0
    refs = load_references(tmp_path / "runs")
    assert set(refs) == {"start", "teacher"}
    for metrics in refs.values():  # greedy accuracy (the module) and coverage (TaskEvaluation)
        assert {"test/countdown3/accuracy", "test/countdown3/pass@8"} <= set(metrics)
    teacher = yaml.safe_load((tmp_path / "runs" / "references" / "teacher" / "config.yaml").read_text())
    assert teacher["model"]["init_args"]["student"] == teacher["model"]["init_args"]["teacher"]
    assert teacher["seed_everything"] == 0 and teacher["data"]["evaluation"]["test_size"] == 4


def test_a_metric_the_teacher_does_not_beat_the_start_on_says_so_instead_of_counting():
    from distill.experiments.report.tables import pivot
    from distill.experiments.run.records import RunRecord

    metric = "test/countdown5/accuracy"
    records = [RunRecord(f"r{m}", Path("."), True, {"mix": m}, {metric: 0.0}) for m in (0, 1)]
    refs = {"start": {metric: 0.0}, "teacher": {metric: 0.0}}
    text = "\n".join(pivot(records, metric, None, ("mix", [0, 1]), references=refs))
    assert "The teacher (0.0) is not above the start (0.0): nothing to distil on this metric." in text
    assert "reach the teacher" not in text
    refs["teacher"][metric] = 0.25
    assert "0 of 2 cells end above the start (0.0); 0 of 2 reach the teacher (25.0)." in "\n".join(
        pivot(records, metric, None, ("mix", [0, 1]), references=refs)
    )
